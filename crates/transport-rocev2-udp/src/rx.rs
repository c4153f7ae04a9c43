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
//! A crate-internal read, for [`UdpRx::wait_with`](crate::UdpRx::wait_with), reads one
//! datagram with its chunks' payloads scattered straight into a caller's buffer, their headers
//! and ICRCs into the receiver's own: the same checks, from the headers, and every segment
//! that missed its place gathered and checked whole. Where the chunks go is known from a peek
//! at the datagram's header, or guessed without one: after a read that landed all in place,
//! the sender's next GSO batch most likely goes on where it ended (see
//! [`RxStats::guessed`]), a guess made while few such guesses miss.
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
use crate::packet::{self, Parsed, Reject};
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
    /// Of those, chunks whose payload the kernel wrote straight into the operation's buffer
    /// ([`UdpRx::wait_with`](crate::UdpRx::wait_with)): no copy in user space.
    pub direct: u64,
    /// Reads straight into an operation's buffer made without peeking at the datagram first,
    /// on the guess that it goes on where the last read ended, that found a datagram; and,
    /// of those, the reads where it did not (its datagram copied instead).
    pub guessed: u64,
    /// See [`guessed`](Self::guessed).
    pub guessed_wrong: u64,
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
    /// Payload, pad and ICRC stripped; empty when the payload is already in place.
    pub payload: &'a [u8],
    /// `Some(at)`: the payload, `len` bytes, was received straight into a caller's buffer at
    /// byte `at` of the run it expected (and `payload` is empty).
    pub placed: Option<usize>,
    /// Payload bytes.
    pub len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Accepted {
    source: SocketAddrV4,
    rank: u32,
    psn: u32,
    imm: u32,
    /// Where the payload is: in the receiver's buffers, or at this offset of the target.
    at: usize,
    direct: bool,
    len: usize,
}

impl Accepted {
    fn chunk<'a>(&self, buf: &'a [u8], lane: u16) -> Chunk<'a> {
        // In the buffers by construction (an empty payload otherwise, which no chunk has).
        let payload = if self.direct {
            &[]
        } else {
            buf.get(self.at..self.at + self.len).unwrap_or_default()
        };
        Chunk {
            source: self.source,
            lane,
            rank: self.rank,
            psn: self.psn,
            imm: self.imm,
            payload,
            placed: self.direct.then_some(self.at),
            len: self.len,
        }
    }
}

/// What [`LaneReceiver::peek`] saw of the datagram queued next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peeked {
    /// Nothing is queued.
    Nothing,
    /// A datagram long enough for the headers: its DETH SrcQP and immediate (unchecked).
    Header {
        /// SrcQP.
        src_qp: u32,
        /// ImmDt.
        imm: u32,
    },
    /// An empty datagram: this rank's own multicast, trimmed by the socket's filter (or a
    /// peer's empty one). [`LaneReceiver::skip_empty`] takes it.
    Empty,
    /// Something shorter than the headers (a truncated datagram).
    Other,
}

/// The run [`LaneReceiver::recv_into`] expects: `n` chunks from SrcQP `src_qp`, immediates
/// `first_imm`, `first_imm + 1`..., payloads `chunk_len` bytes each but the last's
/// `last_len`, back to back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Expect {
    pub(crate) src_qp: u32,
    pub(crate) first_imm: u32,
    pub(crate) n: usize,
    pub(crate) chunk_len: usize,
    pub(crate) last_len: usize,
}

impl Expect {
    /// Target bytes the run spans.
    pub(crate) fn bytes(&self) -> usize {
        self.n.saturating_sub(1) * self.chunk_len + self.last_len
    }

    /// Payload bytes of chunk `i`.
    fn len(&self, i: usize) -> usize {
        if i + 1 == self.n {
            self.last_len
        } else {
            self.chunk_len
        }
    }
}

/// Most chunks one [`LaneReceiver::recv_into`] lays into its target (a GRO super-packet of
/// the smallest chunks).
pub(crate) const MAX_DIRECT: usize = 64;

/// The receive side of one lane.
#[derive(Debug)]
pub struct LaneReceiver {
    sock: RxSocket,
    cfg: RxConfig,
    buf: Vec<u8>,
    /// Headers and ICRCs of the chunks [`recv_into`](Self::recv_into) lays into its target.
    heads: Vec<u8>,
    tails: Vec<u8>,
    control: [u8; 128],
    meta: Vec<RecvMeta>,
    accepted: Vec<Accepted>,
    checker: IcrcChecker,
    stats: RxStats,
    /// The last read found nothing queued (see [`found_empty`](Self::found_empty)).
    found_empty: bool,
    /// After a [`recv_into`](Self::recv_into) whose every datagram landed on its place and was
    /// accepted there: the sender and the immediate its next chunk would carry, where the
    /// next datagram is likely to go on ([`follow`](Self::follow)).
    follow: Option<(u32, u32)>,
    /// How following has gone: see [`Follow`].
    followed: Follow,
}

/// How reads on a [`LaneReceiver::follow`] guess went: a guess is offered while few of the
/// recent ones missed, else one opportunity in [`Follow::PROBE`], so that a run of hits can
/// bring it back. A Broadcast's receiver sees one sender, whose GSO batches follow each other:
/// every guess but an operation's last hits. An Allgather's sees several senders' batches
/// interleaved, and a guess misses whenever the sender changes (a fifth of the time with 4
/// ranks, more with 8), each miss a copy of the datagram where a peek was a system call.
#[derive(Clone, Copy, Debug, Default)]
struct Follow {
    /// Reads on a guess that found a datagram, and those whose datagram was not all on its
    /// place; both halved every [`Follow::WINDOW`] reads.
    tries: u32,
    misses: u32,
    /// Opportunities passed over since the last guess offered.
    passed: u32,
}

impl Follow {
    /// Reads over which the counts are kept (then halved).
    const WINDOW: u32 = 64;
    /// At most one miss in this many reads keeps guessing.
    const MISS_RATIO: u32 = 16;
    /// While guessing is off, one opportunity in this many is taken all the same.
    const PROBE: u32 = 16;

    /// Whether to guess at this opportunity.
    fn offer(&mut self) -> bool {
        let good = self.misses * Self::MISS_RATIO <= self.tries;
        self.passed += 1;
        let offer = good || self.passed >= Self::PROBE;
        if offer {
            self.passed = 0;
        }
        offer
    }

    /// A read on a guess found a datagram: `hit` if all of it landed on its place.
    fn count(&mut self, hit: bool) {
        self.tries += 1;
        self.misses += u32::from(!hit);
        if self.tries >= Self::WINDOW {
            self.tries /= 2;
            self.misses /= 2;
        }
    }
}

impl LaneReceiver {
    /// A receiver on `sock` with `cfg`'s checks; allocates its buffers (2 MiB).
    pub fn new(sock: RxSocket, mut cfg: RxConfig) -> Self {
        cfg.sources.sort_unstable_by_key(|(a, _)| source_key(*a));
        LaneReceiver {
            sock,
            cfg,
            buf: vec![0; BATCH_SIZE.max(2) * SLOT],
            heads: vec![0; MAX_DIRECT * packet::HEADER_LEN],
            tails: vec![0; MAX_DIRECT * packet::ICRC_LEN],
            control: [0; 128],
            meta: vec![RecvMeta::default(); BATCH_SIZE],
            accepted: Vec::with_capacity(BATCH_SIZE * 64),
            checker: IcrcChecker::default(),
            stats: RxStats::default(),
            found_empty: false,
            follow: None,
            followed: Follow::default(),
        }
    }

    /// Where the last [`recv_into`](Self::recv_into) says the next datagram likely goes on
    /// (its sender and the immediate of its first chunk): set when every datagram of that read
    /// landed on its place and was accepted, cleared by any other read. Reading on from it
    /// without a peek costs a copy of that datagram if it was wrong (see `recv_into`), so it
    /// is offered only while few guesses miss ([`Follow`]): a `recv_into` on it says so.
    pub(crate) fn follow(&mut self) -> Option<(u32, u32)> {
        self.follow.filter(|_| self.followed.offer())
    }

    /// Whether the last read found the socket empty (nothing queued), as opposed to reading
    /// datagrams, or failing. A read whose datagrams were all dropped (another job's, this
    /// rank's own trimmed multicast) holds no chunk, yet more may be queued behind them: an
    /// owner that needs the socket read empty reads again until this says so.
    pub fn found_empty(&self) -> bool {
        self.found_empty
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

    /// Waits until datagrams arrive or `timeout` passes (one too long for the clock to add,
    /// `Duration::MAX`, is no deadline), then reads one batch. The batch is empty at the
    /// timeout, or when every datagram read was dropped ([`found_empty`](Self::found_empty)
    /// tells the two apart).
    pub fn recv(&mut self, timeout: Duration) -> Result<RxBatch<'_>, RxError> {
        self.recv_by(timeout, Self::read_batch)?;
        Ok(self.batch())
    }

    /// Reads with `read` (the datagrams it read, 0 when nothing was queued) until it reads
    /// something, someone calls the waker, or `timeout` passes, sleeping on the socket in
    /// between: the wait of [`recv`](Self::recv) and of a read in place.
    pub(crate) fn recv_by(
        &mut self,
        timeout: Duration,
        mut read: impl FnMut(&mut Self) -> io::Result<usize>,
    ) -> io::Result<()> {
        // A timeout past what an `Instant` can hold (`Duration::MAX`) is no deadline at all.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if read(self)? > 0 {
                return Ok(());
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(()),
                },
                None => timeout,
            };
            if self.sock.wait_readable(left)? == crate::socket::Wait::Woken {
                // Someone has work for our owner: return now, with nothing read.
                return Ok(());
            }
        }
    }

    /// Forgets the last batch (after a read that failed).
    pub(crate) fn clear(&mut self) {
        self.accepted.clear();
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

    /// One batched read (`recvmmsg`, non-blocking), then checks; returns the datagrams read,
    /// empty ones included (0: nothing was queued).
    pub(crate) fn read_batch(&mut self) -> io::Result<usize> {
        self.accepted.clear();
        self.found_empty = false;
        self.follow = None;
        let msgs = {
            let mut slots = self.buf.chunks_mut(SLOT);
            let mut bufs: [IoSliceMut<'_>; BATCH_SIZE] =
                std::array::from_fn(|_| IoSliceMut::new(slots.next().unwrap_or_default()));
            match self.sock.recv(&mut bufs, &mut self.meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.found_empty = true;
                    return Ok(0);
                }
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
                self.check(meta.addr, meta.dst_ip, slot + at, slot + end);
                datagrams += 1;
                at = end;
            }
        }
        self.stats.datagrams += datagrams as u64;
        // Empty ones count as read: the queue was not empty, so the caller reads again before
        // it waits (the wait is edge-triggered).
        Ok(datagrams + empty)
    }

    /// Checks the datagram `buf[start..end]` from `addr` and records it as accepted or
    /// dropped.
    fn check(
        &mut self,
        addr: SocketAddr,
        dst_ip: Option<std::net::IpAddr>,
        start: usize,
        end: usize,
    ) {
        let d = &self.buf[start..end];
        let Some((source, p)) = admit(&self.cfg, &mut self.stats, d, addr) else {
            return;
        };
        if self.cfg.verify_icrc {
            let group = self.sock.group();
            let dst = match dst_ip {
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
        self.accept(source, &p, start + packet::PAYLOAD_AT, false);
    }

    fn accept(&mut self, source: SocketAddrV4, p: &Parsed, at: usize, direct: bool) {
        self.stats.accepted += 1;
        self.stats.payload_bytes += p.payload_len as u64;
        self.stats.direct += u64::from(direct);
        self.accepted.push(Accepted {
            source,
            rank: p.src_qp,
            psn: p.psn,
            imm: p.imm,
            at,
            direct,
            len: p.payload_len,
        });
    }

    /// Looks at the datagram queued next without taking it (non-blocking): what a caller
    /// needs to predict where its chunks go before [`recv_into`](Self::recv_into).
    pub(crate) fn peek(&mut self) -> io::Result<Peeked> {
        let mut h = [0u8; packet::HEADER_LEN];
        self.found_empty = false;
        match crate::sys::peek(self.sock.udp(), &mut h) {
            Ok((n, _)) if n >= packet::HEADER_LEN => {
                let (src_qp, imm) = packet::src_and_imm(&h);
                Ok(Peeked::Header { src_qp, imm })
            }
            Ok((0, _)) => Ok(Peeked::Empty),
            Ok(_) => Ok(Peeked::Other),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.found_empty = true;
                Ok(Peeked::Nothing)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes the empty datagram [`peek`](Self::peek) found, alone: a batched read in its
    /// place would take the datagrams queued behind it too, and copy their chunks. Counted
    /// as [`RxStats::empty`].
    pub(crate) fn skip_empty(&mut self) -> io::Result<()> {
        match self.sock.udp().recv(&mut []) {
            Ok(_) => {
                self.stats.recv_calls += 1;
                self.stats.empty += 1;
                self.found_empty = false;
                Ok(())
            }
            // Nothing there after all: the caller peeks again.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads the next datagram (one `recvmsg`, non-blocking), laying the payloads of the
    /// chunks `expect` names straight into `target` (exactly [`Expect::bytes`] long) and
    /// their headers and ICRCs into the receiver's own buffers: the kernel's copy is the only
    /// one. A GRO super-packet is split by its segment size as in a batched read.
    ///
    /// Each segment that fell exactly on an expected chunk's place is checked from its
    /// headers (as any datagram, and for the expected SrcQP and immediate): accepted, it is a
    /// chunk whose payload is [`placed`](Chunk::placed). Every other segment (a different
    /// chunk, a different length, more segments than expected) is gathered into the
    /// receiver's buffers first, before anything is placed, and checked as usual, so a
    /// datagram the prediction missed is never lost, only copied. What lands in `target`
    /// without being accepted there is garbage in chunks nobody has yet.
    ///
    /// Chunks with a pad (a payload length not a multiple of 4), or a receiver that checks
    /// ICRCs, take the batched read instead: returns `Ok(None)` without reading. Otherwise
    /// the datagrams read (empty ones included, 0 when nothing was queued).
    ///
    /// `on_guess`: `expect` is [`follow`](Self::follow)'s guess, not a peeked header's: how
    /// the read goes is counted for the next offers.
    pub(crate) fn recv_into(
        &mut self,
        target: &mut [u8],
        expect: Expect,
        on_guess: bool,
    ) -> io::Result<Option<usize>> {
        let n = expect.n;
        if self.cfg.verify_icrc
            || n == 0
            || n > MAX_DIRECT
            || !expect.chunk_len.is_multiple_of(4)
            || !expect.last_len.is_multiple_of(4)
            || target.len() != expect.bytes()
        {
            return Ok(None);
        }
        self.accepted.clear();
        self.found_empty = false;
        let follow = self.follow.take();
        let got = {
            let (heads, tails) = (&mut self.heads, &mut self.tails);
            let spare = &mut self.buf[..SLOT];
            let mut bufs: [&mut [u8]; crate::sys::MAX_SCATTER] =
                std::array::from_fn(|_| &mut [][..]);
            let mut rest = &mut *target;
            let mut k = 0;
            let pieces = heads
                .chunks_exact_mut(packet::HEADER_LEN)
                .zip(tails.chunks_exact_mut(packet::ICRC_LEN))
                .take(n);
            for (i, (h, t)) in pieces.enumerate() {
                let (p, r) = std::mem::take(&mut rest).split_at_mut(expect.len(i));
                rest = r;
                bufs[k] = h;
                bufs[k + 1] = p;
                bufs[k + 2] = t;
                k += 3;
            }
            bufs[k] = spare;
            match crate::sys::recv_scatter(self.sock.udp(), &mut bufs[..k + 1], &mut self.control) {
                Ok(g) => g,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Nothing read: where the next datagram goes on is as it was.
                    self.follow = follow;
                    self.found_empty = true;
                    return Ok(Some(0));
                }
                Err(e) => return Err(e),
            }
        };
        self.stats.recv_calls += 1;
        if got.len == 0 {
            // This rank's own trimmed multicast, between a peer's datagrams: nothing placed.
            self.follow = follow;
            self.stats.empty += 1;
            return Ok(Some(1));
        }
        let addr = got
            .from
            .as_socket()
            .unwrap_or(SocketAddr::V4(SocketAddrV4::new(
                std::net::Ipv4Addr::UNSPECIFIED,
                0,
            )));
        let stride = match gro_segment(&self.control[..got.control_len.min(self.control.len())]) {
            Some(s) if s > 0 => s,
            _ => got.len,
        };
        let full = packet::datagram_len(expect.chunk_len);
        // Segments that did not fall on their expected place, gathered here.
        let mut gather = SLOT;
        let mut datagrams = 0;
        let mut at = 0;
        let mut i = 0;
        while at < got.len {
            let end = (at + stride).min(got.len);
            let on_place =
                i < n && at == i * full && end - at == packet::datagram_len(expect.len(i));
            if on_place && self.check_placed(addr, i, &expect) {
                // Accepted in place, or dropped for a header reason (counted).
            } else {
                let len = end - at;
                self.gather(target, &expect, at, end, gather);
                self.check(addr, None, gather, gather + len);
                gather += len;
            }
            datagrams += 1;
            at = end;
            i += 1;
        }
        self.stats.datagrams += datagrams as u64;
        let hit = self.accepted.len() == datagrams && self.accepted.iter().all(|a| a.direct);
        if on_guess {
            self.followed.count(hit);
            self.stats.guessed += 1;
            self.stats.guessed_wrong += u64::from(!hit);
        }
        if hit {
            self.follow = Some((
                expect.src_qp,
                expect.first_imm.wrapping_add(datagrams as u32),
            ));
        }
        Ok(Some(datagrams))
    }

    /// Checks the segment that fell on expected chunk `i`'s place from its header and ICRC
    /// (in the receiver's buffers; the payload is in the target): true when it was accepted
    /// in place or dropped for a header reason (counted), false when it must be gathered and
    /// checked as a whole (a pad, another chunk than expected).
    fn check_placed(&mut self, addr: SocketAddr, i: usize, expect: &Expect) -> bool {
        let hl = packet::HEADER_LEN;
        let mut d = [0u8; packet::OVERHEAD];
        d[..hl].copy_from_slice(&self.heads[i * hl..(i + 1) * hl]);
        d[hl..].copy_from_slice(&self.tails[i * packet::ICRC_LEN..(i + 1) * packet::ICRC_LEN]);
        if packet::pad_count(&d) != 0 {
            return false;
        }
        // Headers and ICRC alone parse as a datagram with an empty payload: the same checks
        // in the same order, the payload's length aside (it is the place's, within the max).
        let Some((source, mut p)) = admit(&self.cfg, &mut self.stats, &d, addr) else {
            return true;
        };
        if p.src_qp != expect.src_qp || p.imm != expect.first_imm.wrapping_add(i as u32) {
            return false;
        }
        p.payload_len = expect.len(i);
        if p.payload_len > self.cfg.max_payload {
            return false;
        }
        self.accept(source, &p, i * expect.chunk_len, true);
        true
    }

    /// Copies bytes `a..b` of what [`recv_into`](Self::recv_into) read (headers, target
    /// places and ICRCs of the expected chunks in turn, then the spare slot) to `buf[to..]`.
    fn gather(&mut self, target: &[u8], expect: &Expect, a: usize, b: usize, to: usize) {
        let (hl, tl) = (packet::HEADER_LEN, packet::ICRC_LEN);
        let mut out = to;
        let mut at = 0; // stream offset of the current piece
        for i in 0..expect.n {
            let pl = expect.len(i);
            let off = i * expect.chunk_len;
            for (piece, len) in [(0u8, hl), (1, pl), (2, tl)] {
                let (lo, hi) = (a.max(at), b.min(at + len));
                if lo < hi {
                    let (r0, r1) = (lo - at, hi - at);
                    let src: &[u8] = match piece {
                        0 => &self.heads[i * hl + r0..i * hl + r1],
                        1 => &target[off + r0..off + r1],
                        _ => &self.tails[i * tl + r0..i * tl + r1],
                    };
                    self.buf[out..out + (hi - lo)].copy_from_slice(src);
                    out += hi - lo;
                }
                at += len;
            }
        }
        // The spare slot, at the front of `buf`.
        let (lo, hi) = (a.max(at), b);
        if lo < hi {
            self.buf.copy_within(lo - at..hi - at, out);
        }
    }
}

/// The header checks and the source check of datagram `d` from `addr`, counting a drop.
fn admit(
    cfg: &RxConfig,
    stats: &mut RxStats,
    d: &[u8],
    addr: SocketAddr,
) -> Option<(SocketAddrV4, Parsed)> {
    let p = match packet::parse(d, cfg.pkey, cfg.qkey, cfg.max_payload) {
        Ok(p) => p,
        Err(r) => {
            tracing::trace!(lane = cfg.lane, reason = ?r, src = %addr, "drop");
            stats.count(r);
            return None;
        }
    };
    let SocketAddr::V4(source) = addr else {
        stats.unknown_source += 1;
        return None;
    };
    if !cfg.sources.is_empty() {
        let known = cfg
            .sources
            .binary_search_by_key(&source_key(source), |(a, _)| source_key(*a))
            .ok()
            .map(|i| cfg.sources[i].1);
        if known != Some(p.src_qp) {
            tracing::trace!(lane = cfg.lane, src = %source, rank = p.src_qp, "drop: unknown source");
            stats.unknown_source += 1;
            return None;
        }
    }
    Some((source, p))
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
        Some(self.accepted.get(i)?.chunk(self.buf, self.lane))
    }

    /// The accepted chunks, in arrival order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Chunk<'a>> + 'a {
        let (buf, lane) = (self.buf, self.lane);
        self.accepted.iter().map(move |a| a.chunk(buf, lane))
    }
}

/// The GRO segment size in a `recvmsg`'s ancillary data (`UDP_GRO`), if any.
fn gro_segment(control: &[u8]) -> Option<usize> {
    let head = std::mem::size_of::<libc::cmsghdr>();
    let align = std::mem::size_of::<usize>();
    let mut at = 0;
    while at + head <= control.len() {
        let word = |o: usize, n: usize| control.get(at + o..at + o + n);
        let len = usize::from_ne_bytes(word(0, align)?.try_into().ok()?);
        let level = i32::from_ne_bytes(word(align, 4)?.try_into().ok()?);
        let kind = i32::from_ne_bytes(word(align + 4, 4)?.try_into().ok()?);
        if len < head {
            return None;
        }
        if level == libc::SOL_UDP && kind == libc::UDP_GRO {
            let v = i32::from_ne_bytes(word(head, 4)?.try_into().ok()?);
            return usize::try_from(v).ok();
        }
        at += len.div_ceil(align) * align;
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::addr::{AddrConfig, JobAddrs};
    use crate::socket::{SocketConfig, TxSocket};
    use crate::tx::{LaneSender, OutChunk, TxConfig};

    const CS: usize = 4096;

    /// A lane sender (rank 2, GSO on) and a receiver of its group on loopback.
    pub(crate) struct Pair {
        pub(crate) tx: LaneSender,
        pub(crate) rx: LaneReceiver,
        pub(crate) qkey: u32,
        pub(crate) group: SocketAddrV4,
    }

    fn pair(nonce: u64) -> Pair {
        pair_with(nonce, |_| {})
    }

    /// A UDP port nobody holds now: a test's groups on it are its own.
    pub(crate) fn fresh_port() -> u16 {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// [`Pair`] with the receiver's config changed by `f`.
    pub(crate) fn pair_with(nonce: u64, f: impl FnOnce(&mut RxConfig)) -> Pair {
        let cfg = AddrConfig {
            port: fresh_port(),
            ..AddrConfig::default()
        };
        let job = JobAddrs::derive(nonce, 1, &cfg).unwrap();
        let group = job.group(0).unwrap();
        let mut cfg = RxConfig::new(0, 0xFFFF, job.qkey(), CS);
        f(&mut cfg);
        let rx = LaneReceiver::new(
            RxSocket::open(&SocketConfig::loopback(), group).unwrap(),
            cfg,
        );
        Pair {
            tx: sender(group, job.qkey()),
            rx,
            qkey: job.qkey(),
            group,
        }
    }

    fn sender(group: SocketAddrV4, qkey: u32) -> LaneSender {
        LaneSender::new(
            TxSocket::open(&SocketConfig::loopback()).unwrap(),
            TxConfig {
                lane: 0,
                group,
                pkey: 0xFFFF,
                qkey,
                rank: 2,
                max_payload: CS,
                gso: true,
                initial_psn: 0,
            },
        )
        .unwrap()
    }

    fn payload(imm: u32, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (imm as usize * 7 + i * 13) as u8)
            .collect()
    }

    /// Sends chunks `imms`, `len` bytes each, as one GSO batch.
    fn send(tx: &mut LaneSender, imms: std::ops::Range<u32>, len: usize) {
        let data: Vec<(u32, Vec<u8>)> = imms.map(|i| (i, payload(i, len))).collect();
        let chunks: Vec<OutChunk<'_>> = data
            .iter()
            .map(|(imm, p)| OutChunk {
                imm: *imm,
                payload: p,
            })
            .collect();
        assert_eq!(tx.send_batch(&chunks).unwrap().chunks, chunks.len());
    }

    /// Waits for a datagram, then one `recv_into` with `expect`: every accepted chunk as
    /// (immediate, where it was placed, its payload wherever it is).
    fn read(
        rx: &mut LaneReceiver,
        target: &mut [u8],
        expect: Expect,
    ) -> Vec<(u32, Option<usize>, Vec<u8>)> {
        let t0 = Instant::now();
        while rx.peek().unwrap() == Peeked::Nothing {
            assert!(t0.elapsed() < Duration::from_secs(10), "nothing arrived");
            rx.sock.wait_readable(Duration::from_millis(50)).unwrap();
        }
        assert!(rx.recv_into(target, expect, false).unwrap().unwrap() > 0);
        let out: Vec<_> = rx
            .last_batch()
            .iter()
            .map(|c| {
                let bytes = match c.placed {
                    Some(at) => target[at..at + c.len].to_vec(),
                    None => c.payload.to_vec(),
                };
                (c.imm, c.placed, bytes)
            })
            .collect();
        out
    }

    fn expect(first_imm: u32, n: usize, last_len: usize) -> Expect {
        Expect {
            src_qp: 2,
            first_imm,
            n,
            chunk_len: CS,
            last_len,
        }
    }

    /// A GSO batch whose chunks are the ones predicted lands in place: no copy, every byte
    /// right; one more place than chunks is left alone.
    #[test]
    fn a_predicted_batch_lands_in_place() {
        let mut p = pair(0xD1_0001);
        send(&mut p.tx, 100..115, CS);
        let mut target = vec![0u8; 16 * CS];
        let got = read(&mut p.rx, &mut target, expect(100, 16, CS));
        assert_eq!(got.len(), 15);
        for (i, (imm, placed, bytes)) in got.iter().enumerate() {
            assert_eq!(*imm, 100 + i as u32);
            assert_eq!(*placed, Some(i * CS));
            assert!(*bytes == payload(*imm, CS), "chunk {imm}");
        }
        assert!(target[15 * CS..].iter().all(|&b| b == 0));
        assert_eq!((p.rx.stats().direct, p.rx.stats().accepted), (15, 15));
    }

    /// A read all in place says where the sender's next batch goes on; a read on that guess
    /// that misses (another sender's batch, here a jump) says nothing, and is copied whole.
    #[test]
    fn a_read_all_in_place_says_where_the_next_goes_on() {
        let mut p = pair(0xD1_0005);
        assert_eq!(p.rx.follow(), None);
        send(&mut p.tx, 100..115, CS);
        let mut target = vec![0u8; 15 * CS];
        assert_eq!(read(&mut p.rx, &mut target, expect(100, 15, CS)).len(), 15);
        assert_eq!(p.rx.follow(), Some((2, 115)));
        // The sender jumps ahead: the guess (115 on) misses, the chunks are still whole.
        send(&mut p.tx, 130..145, CS);
        let got = read(&mut p.rx, &mut target, expect(115, 15, CS));
        assert_eq!(got.len(), 15);
        for (i, (imm, placed, bytes)) in got.iter().enumerate() {
            assert_eq!((*imm, *placed), (130 + i as u32, None));
            assert!(*bytes == payload(*imm, CS), "chunk {imm}");
        }
        assert_eq!(p.rx.follow(), None);
        assert_eq!(p.rx.stats().direct, 15);
    }

    /// Guesses are offered while few miss; once a fifth miss, one opportunity in
    /// [`Follow::PROBE`], until hits bring the share down again.
    #[test]
    fn guesses_stop_while_they_miss_and_come_back_with_hits() {
        let mut f = Follow::default();
        let offered = |f: &mut Follow, n: u32| (0..n).filter(|_| f.offer()).count() as u32;
        assert_eq!(offered(&mut f, 10), 10);
        for i in 0..40 {
            f.count(i % 5 != 0);
        }
        assert_eq!(offered(&mut f, 4 * Follow::PROBE), 4);
        for _ in 0..Follow::WINDOW * 4 {
            f.count(true);
        }
        assert_eq!(offered(&mut f, 10), 10);
    }

    /// A batch the prediction missed (shifted by two chunks), or only partly covered, is
    /// gathered and handed out whole: nothing is lost, only copied.
    #[test]
    fn a_missed_or_longer_batch_is_gathered_whole() {
        let mut p = pair(0xD1_0002);
        send(&mut p.tx, 102..117, CS);
        let mut target = vec![0u8; 16 * CS];
        let got = read(&mut p.rx, &mut target, expect(100, 16, CS));
        assert_eq!(got.len(), 15);
        for (i, (imm, placed, bytes)) in got.iter().enumerate() {
            assert_eq!((*imm, *placed), (102 + i as u32, None));
            assert!(*bytes == payload(*imm, CS), "chunk {imm}");
        }
        assert_eq!(p.rx.stats().direct, 0);

        send(&mut p.tx, 200..215, CS);
        let mut target = vec![0u8; 5 * CS];
        let got = read(&mut p.rx, &mut target, expect(200, 5, CS));
        assert_eq!(got.len(), 15);
        for (i, (imm, placed, bytes)) in got.iter().enumerate() {
            assert_eq!(*imm, 200 + i as u32);
            assert_eq!(*placed, (i < 5).then_some(i * CS));
            assert!(*bytes == payload(*imm, CS), "chunk {imm}");
        }
        assert_eq!(p.rx.stats().direct, 5);
    }

    /// A short last chunk lands in place; one with a pad is left to the batched read; a
    /// datagram of another job that falls on a place is dropped and counted, not accepted.
    #[test]
    fn short_chunks_pads_and_strangers() {
        let mut p = pair(0xD1_0003);
        send(&mut p.tx, 300..301, 1000);
        let mut target = vec![0u8; 1000];
        let got = read(&mut p.rx, &mut target, expect(300, 1, 1000));
        assert_eq!(got, vec![(300, Some(0), payload(300, 1000))]);

        let mut odd = vec![0u8; 1001];
        assert_eq!(
            p.rx.recv_into(&mut odd, expect(300, 1, 1001), false)
                .unwrap(),
            None
        );

        let mut stranger = sender(p.group, p.qkey ^ 1);
        send(&mut stranger, 400..415, CS);
        let mut target = vec![0u8; 15 * CS];
        let got = read(&mut p.rx, &mut target, expect(400, 15, CS));
        assert!(got.is_empty(), "{} accepted", got.len());
        assert_eq!(p.rx.stats().qkey, 15);
        assert_eq!(p.rx.stats().accepted, 1);
    }

    /// `recv(Duration::MAX)` waits without a deadline ("forever") until the waker ends it,
    /// and takes what is queued at once; it used to panic adding the timeout to the clock.
    #[test]
    fn a_receive_without_a_deadline_waits_until_woken() {
        let mut p = pair(0xD1_0004);
        let waker = p.rx.waker();
        let wake = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            waker.wake();
        });
        assert!(p.rx.recv(Duration::MAX).unwrap().is_empty());
        wake.join().unwrap();
        send(&mut p.tx, 500..501, CS);
        let got = p.rx.recv(Duration::MAX).unwrap();
        assert_eq!(got.get(0).map(|c| c.imm), Some(500));
    }

    /// A read whose datagrams were all dropped holds no chunk, but the socket was not found
    /// empty: a good chunk may be queued behind them. Only the read that finds nothing
    /// queued says so, in the batched read and in the in-place path's peek alike.
    #[test]
    fn a_read_of_only_dropped_datagrams_does_not_find_the_socket_empty() {
        let mut p = pair(0xD1_0005);
        let mut stranger = LaneSender::new(
            TxSocket::open(&SocketConfig::loopback()).unwrap(),
            TxConfig {
                lane: 0,
                group: p.group,
                pkey: 0xFFFF,
                qkey: p.qkey ^ 1,
                rank: 2,
                max_payload: CS,
                gso: false,
                initial_psn: 0,
            },
        )
        .unwrap();
        // More datagrams of another job than one `recvmmsg` takes, then one good chunk.
        let strangers = BATCH_SIZE as u32 + 8;
        for k in 0..strangers {
            send(&mut stranger, k..k + 1, 64);
        }
        send(&mut p.tx, 999..1000, 64);
        let t0 = Instant::now();
        while p.rx.peek().unwrap() == Peeked::Nothing {
            assert!(t0.elapsed() < Duration::from_secs(10), "nothing arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!p.rx.found_empty());
        std::thread::sleep(Duration::from_millis(100));
        assert!(p.rx.recv(Duration::from_millis(5)).unwrap().is_empty());
        assert!(!p.rx.found_empty(), "only dropped datagrams read");
        let mut got = Vec::new();
        let mut reads = 0;
        while !p.rx.found_empty() {
            reads += 1;
            assert!(reads < 10, "the socket is never found empty");
            got.extend(p.rx.recv(Duration::ZERO).unwrap().iter().map(|c| c.imm));
        }
        assert_eq!(got, [999]);
        assert_eq!(p.rx.stats().qkey, u64::from(strangers));
        assert_eq!(p.rx.peek().unwrap(), Peeked::Nothing);
        assert!(p.rx.found_empty());
    }

    #[test]
    fn the_gro_segment_size_is_read_from_the_control_data() {
        let head = std::mem::size_of::<libc::cmsghdr>();
        let mut c = vec![0u8; 2 * (head + 8)];
        // An IP_PKTINFO-like entry first, then UDP_GRO.
        c[..8].copy_from_slice(&(head + 4).to_ne_bytes());
        c[8..12].copy_from_slice(&libc::IPPROTO_IP.to_ne_bytes());
        c[12..16].copy_from_slice(&libc::IP_PKTINFO.to_ne_bytes());
        let at = head + 8;
        c[at..at + 8].copy_from_slice(&(head + 4).to_ne_bytes());
        c[at + 8..at + 12].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
        c[at + 12..at + 16].copy_from_slice(&libc::UDP_GRO.to_ne_bytes());
        c[at + head..at + head + 4].copy_from_slice(&4124i32.to_ne_bytes());
        assert_eq!(gro_segment(&c), Some(4124));
        assert_eq!(gro_segment(&c[..at]), None);
        assert_eq!(gro_segment(&[]), None);
    }
}
