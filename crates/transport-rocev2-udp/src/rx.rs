//! Receive path of one lane: `recvmmsg` + GRO into reusable buffers, checks, zero-copy chunks.
//!
//! One [`LaneReceiver::recv`] is one quinn-udp `recv` (`recvmmsg` of up to
//! [`quinn_udp::BATCH_SIZE`] messages). Each message may be a GRO super-packet, split here by
//! its `stride`. Each datagram is checked in this order, and a failing one is dropped and
//! counted in [`RxStats`] by its reason:
//! 1. core's header checks before anything else: length, opcode, P_Key, DestQP, Q_Key, then
//!    header version and reserved bits; then the receiver's size limit (oversize);
//! 2. the source, when the receiver knows its senders ([`RxConfig::sources`]);
//! 3. the ICRC, if [`RxConfig::verify_icrc`].
//!
//! The ICRC check is optional and off by default: a kernel UDP socket only delivers datagrams
//! whose UDP checksum verified, and that checksum covers the whole UDP payload, the BTH, DETH,
//! ImmDt (the immediate) and payload included, so the ICRC adds no integrity here; it exists
//! for RDMA hardware. Checking it also has to guess the IP ID, which a UDP socket cannot see
//! (see [`crate::icrc`]): it accepts any ID a GSO sender produces.
//!
//! Buffers are allocated once (one 64 KiB slot per message, enough for any IPv4 datagram or
//! GRO super-packet, so nothing is ever truncated by the kernel and oversize is always seen);
//! accepted chunks borrow their payload from them until the next `recv`.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use quinn_udp::{BATCH_SIZE, RecvMeta};
use ringcast_core::wire::RoceDrop;

use crate::icrc::{FlowIcrc, IcrcChecker};
use crate::packet::{self, Reject};
use crate::socket::RxSocket;

/// Bytes per receive slot: the largest IPv4 datagram rounded up.
const SLOT: usize = 1 << 16;

/// What one lane accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RxConfig {
    /// Lane index, reported with each chunk.
    pub lane: u16,
    /// Expected BTH P_Key.
    pub pkey: u16,
    /// Expected DETH Q_Key (the job's).
    pub qkey: u32,
    /// Largest chunk payload accepted.
    pub max_payload: usize,
    /// Check each datagram's ICRC (off by default: the UDP checksum already covers it all).
    pub verify_icrc: bool,
    /// Known senders (source `IP:port`, rank): when not empty, a datagram from another address,
    /// or whose SrcQP is not that address's rank, is dropped as an unknown source.
    pub sources: Vec<(SocketAddrV4, u32)>,
}

impl RxConfig {
    /// Accepts chunks up to `max_payload` carrying `pkey` and `qkey`, from any source, ICRC
    /// unchecked.
    pub fn new(lane: u16, pkey: u16, qkey: u32, max_payload: usize) -> Self {
        RxConfig {
            lane,
            pkey,
            qkey,
            max_payload,
            verify_icrc: false,
            sources: Vec::new(),
        }
    }
}

/// Counters of one lane's receiver; every datagram read is either accepted or counted under
/// exactly one drop reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxStats {
    /// `recvmmsg` calls that returned data.
    pub recv_calls: u64,
    /// Datagrams read (GRO super-packets counted by segment).
    pub datagrams: u64,
    /// Empty datagrams: this rank's own multicast, trimmed by the socket's filter
    /// ([`RxSocket::ignore_source`](crate::RxSocket::ignore_source)), or a peer's empty one.
    /// Neither a chunk nor a drop: not in `datagrams`.
    pub empty: u64,
    /// Datagrams accepted as chunks.
    pub accepted: u64,
    /// Payload bytes accepted.
    pub payload_bytes: u64,
    /// Shorter than the headers and ICRC (or than the pad they announce).
    pub truncated: u64,
    /// Payload longer than `RxConfig::max_payload`.
    pub oversize: u64,
    /// Not a UD `SEND_ONLY_WITH_IMMEDIATE`.
    pub opcode: u64,
    /// Wrong P_Key.
    pub pkey: u64,
    /// Wrong Q_Key (another job, or a stray sender).
    pub qkey: u64,
    /// DestQP other than the multicast QPN 0xFFFFFF.
    pub destqp: u64,
    /// BTH transport header version other than 0.
    pub version: u64,
    /// A reserved bit or pad byte set, or a pad count that does not round the payload to 4.
    pub malformed: u64,
    /// Source address not among the known senders, or SrcQP not its rank.
    pub unknown_source: u64,
    /// ICRC mismatch (only when checked).
    pub bad_icrc: u64,
}

impl RxStats {
    /// Datagrams dropped, all reasons together.
    pub fn dropped(&self) -> u64 {
        self.truncated
            + self.oversize
            + self.opcode
            + self.pkey
            + self.qkey
            + self.destqp
            + self.version
            + self.malformed
            + self.unknown_source
            + self.bad_icrc
    }

    fn count(&mut self, r: Reject) {
        let c = match r {
            Reject::Oversize => &mut self.oversize,
            Reject::Header(RoceDrop::Truncated) => &mut self.truncated,
            Reject::Header(RoceDrop::Opcode) => &mut self.opcode,
            Reject::Header(RoceDrop::PKey) => &mut self.pkey,
            Reject::Header(RoceDrop::DestQp) => &mut self.destqp,
            Reject::Header(RoceDrop::QKey) => &mut self.qkey,
            Reject::Header(RoceDrop::Version) => &mut self.version,
            // Malformed, and any reason core adds later.
            Reject::Header(_) => &mut self.malformed,
        };
        *c += 1;
    }
}

/// A receive call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RxError {
    /// The socket returned an error other than "nothing queued".
    #[error("receive failed: {0}")]
    Io(#[from] io::Error),
}

/// An accepted chunk, its payload borrowed from the receiver's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Sender's `IP:port`.
    pub source: SocketAddrV4,
    /// Lane it arrived on.
    pub lane: u16,
    /// DETH SrcQP: the sender's rank (checked against `source` when sources are known).
    pub rank: u32,
    /// BTH PSN (per sender and lane, 24 bits).
    pub psn: u32,
    /// ImmDt.
    pub imm: u32,
    /// Payload, pad and ICRC stripped.
    pub payload: &'a [u8],
}

#[derive(Clone, Copy, Debug)]
struct Accepted {
    source: SocketAddrV4,
    rank: u32,
    psn: u32,
    imm: u32,
    at: usize,
    len: usize,
}

/// The receive side of one lane.
#[derive(Debug)]
pub struct LaneReceiver {
    sock: RxSocket,
    cfg: RxConfig,
    buf: Vec<u8>,
    meta: Vec<RecvMeta>,
    accepted: Vec<Accepted>,
    checker: IcrcChecker,
    stats: RxStats,
}

impl LaneReceiver {
    /// A receiver on `sock` with `cfg`'s checks; allocates its buffers (2 MiB).
    pub fn new(sock: RxSocket, mut cfg: RxConfig) -> Self {
        cfg.sources.sort_unstable_by_key(|(a, _)| source_key(*a));
        LaneReceiver {
            sock,
            cfg,
            buf: vec![0; BATCH_SIZE * SLOT],
            meta: vec![RecvMeta::default(); BATCH_SIZE],
            accepted: Vec::with_capacity(BATCH_SIZE * 64),
            checker: IcrcChecker::default(),
            stats: RxStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &RxStats {
        &self.stats
    }

    /// The socket (group, granted buffer, kernel drop counter).
    pub fn socket(&self) -> &RxSocket {
        &self.sock
    }

    /// A handle that ends a [`recv`](Self::recv) wait from another thread.
    pub fn waker(&self) -> crate::socket::RxWaker {
        self.sock.waker()
    }

    /// Reads what is queued now (one `recvmmsg`), without waiting; an empty batch if nothing.
    pub fn try_recv(&mut self) -> Result<RxBatch<'_>, RxError> {
        self.read_batch()?;
        Ok(self.batch())
    }

    /// Waits until datagrams arrive or `timeout` passes, then reads one batch. The batch is
    /// empty at the timeout, or when every datagram read was dropped.
    pub fn recv(&mut self, timeout: Duration) -> Result<RxBatch<'_>, RxError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.read_batch()? > 0 {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if self.sock.wait_readable(deadline - now)? == crate::socket::Wait::Woken {
                // Someone has work for our owner: return now, with nothing read.
                break;
            }
        }
        Ok(self.batch())
    }

    /// The chunks accepted by the last read (its buffers stay valid until the next read):
    /// lets an owner hand them out one at a time without copying them first.
    pub fn last_batch(&self) -> RxBatch<'_> {
        self.batch()
    }

    fn batch(&self) -> RxBatch<'_> {
        RxBatch {
            buf: &self.buf,
            accepted: &self.accepted,
            lane: self.cfg.lane,
        }
    }

    /// One `recvmmsg`, then checks; returns the datagrams read, empty ones included.
    fn read_batch(&mut self) -> io::Result<usize> {
        self.accepted.clear();
        let msgs = {
            let mut slots = self.buf.chunks_mut(SLOT);
            let mut bufs: [IoSliceMut<'_>; BATCH_SIZE] =
                std::array::from_fn(|_| IoSliceMut::new(slots.next().unwrap_or_default()));
            match self.sock.recv(&mut bufs, &mut self.meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => return Err(e),
            }
        };
        self.stats.recv_calls += 1;
        let (mut datagrams, mut empty) = (0, 0);
        for m in 0..msgs {
            let meta = self.meta[m];
            let slot = m * SLOT;
            let len = meta.len.min(SLOT);
            if len == 0 {
                self.stats.empty += 1;
                empty += 1;
                continue;
            }
            // A stride of 0 would never advance: treat the message as one datagram.
            let stride = if meta.stride == 0 { len } else { meta.stride };
            let mut at = 0;
            while at < len {
                let end = (at + stride).min(len);
                self.check(&meta, slot + at, slot + end);
                datagrams += 1;
                at = end;
            }
        }
        self.stats.datagrams += datagrams as u64;
        // Empty ones count as read: the queue was not empty, so the caller reads again before
        // it waits (the wait is edge-triggered).
        Ok(datagrams + empty)
    }

    /// Checks the datagram `buf[start..end]` and records it as accepted or dropped.
    fn check(&mut self, meta: &RecvMeta, start: usize, end: usize) {
        let d = &self.buf[start..end];
        let p = match packet::parse(d, self.cfg.pkey, self.cfg.qkey, self.cfg.max_payload) {
            Ok(p) => p,
            Err(r) => {
                tracing::trace!(lane = self.cfg.lane, reason = ?r, src = %meta.addr, "drop");
                self.stats.count(r);
                return;
            }
        };
        let SocketAddr::V4(source) = meta.addr else {
            self.stats.unknown_source += 1;
            return;
        };
        if !self.cfg.sources.is_empty() {
            let known = self
                .cfg
                .sources
                .binary_search_by_key(&source_key(source), |(a, _)| source_key(*a))
                .ok()
                .map(|i| self.cfg.sources[i].1);
            if known != Some(p.src_qp) {
                tracing::trace!(lane = self.cfg.lane, src = %source, rank = p.src_qp, "drop: unknown source");
                self.stats.unknown_source += 1;
                return;
            }
        }
        if self.cfg.verify_icrc {
            let group = self.sock.group();
            let dst = match meta.dst_ip {
                Some(std::net::IpAddr::V4(ip)) => ip,
                _ => *group.ip(),
            };
            let flow = FlowIcrc::new(source, SocketAddrV4::new(dst, group.port()));
            if !self.checker.check(&flow, d, p.icrc) {
                tracing::trace!(lane = self.cfg.lane, src = %source, "drop: bad ICRC");
                self.stats.bad_icrc += 1;
                return;
            }
        }
        self.stats.accepted += 1;
        self.stats.payload_bytes += p.payload_len as u64;
        self.accepted.push(Accepted {
            source,
            rank: p.src_qp,
            psn: p.psn,
            imm: p.imm,
            at: start + packet::PAYLOAD_AT,
            len: p.payload_len,
        });
    }
}

fn source_key(a: SocketAddrV4) -> u64 {
    u64::from(a.ip().to_bits()) << 16 | u64::from(a.port())
}

/// The chunks accepted by one receive call, borrowing the receiver's buffers.
#[derive(Clone, Copy, Debug)]
pub struct RxBatch<'a> {
    buf: &'a [u8],
    accepted: &'a [Accepted],
    lane: u16,
}

impl<'a> RxBatch<'a> {
    /// Chunks accepted.
    pub fn len(&self) -> usize {
        self.accepted.len()
    }

    /// Whether no chunk was accepted.
    pub fn is_empty(&self) -> bool {
        self.accepted.is_empty()
    }

    /// The `i`-th accepted chunk.
    pub fn get(&self, i: usize) -> Option<Chunk<'a>> {
        let a = self.accepted.get(i)?;
        Some(Chunk {
            source: a.source,
            lane: self.lane,
            rank: a.rank,
            psn: a.psn,
            imm: a.imm,
            payload: self.buf.get(a.at..a.at + a.len)?,
        })
    }

    /// The accepted chunks, in arrival order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Chunk<'a>> + 'a {
        let (buf, lane) = (self.buf, self.lane);
        self.accepted.iter().map(move |a| Chunk {
            source: a.source,
            lane,
            rank: a.rank,
            psn: a.psn,
            imm: a.imm,
            payload: &buf[a.at..a.at + a.len],
        })
    }
}
