//! Send path of one lane: RoCEv2 packets, one GSO send per batch.
//!
//! A batch goes out one of two ways, the same bytes on the wire:
//! * **from its place** ([`LaneSender::send_in_place`], with GSO): one `sendmsg` gathers each
//!   datagram from three buffers, `[BTH | DETH | ImmDt]` and `[pad | ICRC]` built here and the
//!   payload where the caller keeps it, so the kernel's copy is the payload's only one;
//! * **laid out** in a staging buffer ([`LaneSender::stage`], then
//!   [`LaneSender::send_staged`]), each segment `[BTH | DETH | ImmDt | payload | pad | ICRC]`,
//!   through quinn-udp: without GSO, and for a caller that must not hold the payload's buffer
//!   while the kernel blocks.
//!
//! Both buffers are allocated once for the largest batch, so sending allocates nothing. With GSO
//! (`UDP_SEGMENT`), one `sendmsg` carries the whole batch and the kernel numbers the segments'
//! IP IDs 0, 1, 2...: segment `i`'s ICRC is computed with IP ID `i`. Without GSO (configured off,
//! unsupported, or switched off by quinn-udp after the kernel refused it) every datagram is its
//! own `sendmsg` and has IP ID 0.
//!
//! The BTH PSN counts datagrams per lane (24 bits, wrapping). The DETH SrcQP carries the
//! sender's rank (so ranks must be below 2^24); receivers also see the source `IP:port`.

use std::io::{self, IoSlice};
use std::net::{SocketAddr, SocketAddrV4};

use quinn_udp::Transmit;

use crate::icrc::{FlowIcrc, LaneIcrc};
use crate::packet::{self, HeaderFields, MASK_24};
use crate::socket::TxSocket;

/// Largest UDP payload of one IPv4 send, GSO batch included (65535 - 20 - 8).
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Linux's cap on segments per GSO send (`UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// What one lane sends with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxConfig {
    /// Lane index (for logs).
    pub lane: u16,
    /// Destination group and port.
    pub group: SocketAddrV4,
    /// BTH P_Key (0xFFFF: the default full-membership partition).
    pub pkey: u16,
    /// DETH Q_Key of the job.
    pub qkey: u32,
    /// This rank, sent as DETH SrcQP (below 2^24).
    pub rank: u32,
    /// Largest chunk payload; every datagram must fit the interface MTU.
    pub max_payload: usize,
    /// Use GSO when the socket supports it.
    pub gso: bool,
    /// PSN of the first datagram.
    pub initial_psn: u32,
}

/// One chunk to send: its immediate and its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutChunk<'a> {
    /// ImmDt (operation tag and chunk index, in core's layout).
    pub imm: u32,
    /// Payload bytes, at most `TxConfig::max_payload`.
    pub payload: &'a [u8],
}

/// What one `send_batch` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Chunks sent (a prefix of those given).
    pub chunks: usize,
    /// UDP payload bytes sent (headers, payload, pad, ICRC): what the pacer charges.
    pub bytes: usize,
}

/// A batch laid out by [`LaneSender::stage`] and not sent yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Staged {
    /// Datagrams laid out.
    pub n: usize,
    seg: usize,
    end: usize,
    gso: bool,
    /// Each datagram's payload length (for the counters of a partly sent batch).
    lens: [u16; MAX_GSO_SEGMENTS],
}

impl Default for Staged {
    fn default() -> Self {
        Staged {
            n: 0,
            seg: 0,
            end: 0,
            gso: false,
            lens: [0; MAX_GSO_SEGMENTS],
        }
    }
}

/// Counters of one lane's sender.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxStats {
    /// Datagrams sent.
    pub datagrams: u64,
    /// Chunk payload bytes sent.
    pub payload_bytes: u64,
    /// UDP payload bytes sent (RoCE headers and ICRC included).
    pub udp_bytes: u64,
    /// `sendmsg` calls.
    pub sends: u64,
    /// Batches resent without GSO after the kernel refused GSO.
    pub gso_fallbacks: u64,
    /// Datagrams gathered from their payload's place (no copy in user space).
    pub in_place: u64,
}

/// Sending failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// A chunk is larger than `TxConfig::max_payload`.
    #[error("chunk payload of {len} bytes exceeds the lane's maximum of {max}")]
    PayloadTooLarge {
        /// Payload length given.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// `max_payload` does not fit one UDP datagram, or `rank` does not fit 24 bits.
    #[error("bad sender config: {0}")]
    BadConfig(&'static str),
    /// The socket refused a send; `sent` chunks of the batch went out before it.
    #[error("send failed after {sent} chunks: {source}")]
    Io {
        /// Chunks of the batch sent before the error (their PSNs are used).
        sent: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Pad and ICRC: the trailer of a datagram sent from its place.
const TRAILER_MAX: usize = 3 + packet::ICRC_LEN;

/// The headers and trailers of a batch sent from its payloads' place.
#[derive(Debug)]
struct Frames {
    heads: [[u8; packet::HEADER_LEN]; MAX_GSO_SEGMENTS],
    tails: [[u8; TRAILER_MAX]; MAX_GSO_SEGMENTS],
}

/// The send side of one lane.
#[derive(Debug)]
pub struct LaneSender {
    sock: TxSocket,
    cfg: TxConfig,
    dest: socket2::SockAddr,
    fields: HeaderFields,
    psn: u32,
    batch_cap: usize,
    staging: Vec<u8>,
    frames: Box<Frames>,
    in_place: bool,
    icrc: LaneIcrc,
    stats: TxStats,
}

impl LaneSender {
    /// A sender on `sock` for the lane `cfg` describes; allocates its staging buffer.
    pub fn new(sock: TxSocket, cfg: TxConfig) -> Result<Self, TxError> {
        // Checked before any arithmetic on it (`usize::MAX`, "no limit", would wrap).
        if cfg.max_payload > crate::MAX_CHUNK_PAYLOAD {
            return Err(TxError::BadConfig(
                "max_payload does not fit a UDP datagram",
            ));
        }
        let seg_max = packet::datagram_len(cfg.max_payload);
        if seg_max > MAX_UDP_PAYLOAD {
            return Err(TxError::BadConfig(
                "max_payload does not fit a UDP datagram",
            ));
        }
        if cfg.rank > MASK_24 {
            return Err(TxError::BadConfig("rank does not fit the 24-bit SrcQP"));
        }
        let batch_cap = (MAX_UDP_PAYLOAD / seg_max).clamp(1, MAX_GSO_SEGMENTS);
        let flow = FlowIcrc::new(sock.local_addr(), cfg.group);
        tracing::debug!(lane = cfg.lane, group = %cfg.group, seg_max, batch_cap, "lane sender");
        Ok(LaneSender {
            fields: HeaderFields {
                pkey: cfg.pkey,
                qkey: cfg.qkey,
                src_qp: cfg.rank,
            },
            psn: cfg.initial_psn & MASK_24,
            batch_cap,
            staging: vec![0; batch_cap * seg_max],
            frames: Box::new(Frames {
                heads: [[0; packet::HEADER_LEN]; MAX_GSO_SEGMENTS],
                tails: [[0; TRAILER_MAX]; MAX_GSO_SEGMENTS],
            }),
            in_place: true,
            dest: socket2::SockAddr::from(SocketAddr::V4(cfg.group)),
            icrc: LaneIcrc::new(flow, batch_cap),
            stats: TxStats::default(),
            sock,
            cfg,
        })
    }

    /// Whether the next batch goes as one GSO send.
    pub fn gso_active(&self) -> bool {
        self.cfg.gso && self.sock.max_gso_segments() > 1
    }

    /// Most chunks one [`send_batch`](Self::send_batch) takes: bounded by the GSO segment
    /// limit and by one send's 64 KiB, also without GSO so that paced batches stay alike.
    pub fn max_batch(&self) -> usize {
        if self.gso_active() {
            self.batch_cap.min(self.sock.max_gso_segments())
        } else {
            self.batch_cap
        }
    }

    /// Whether [`send_in_place`](Self::send_in_place) gathers GSO batches from the payloads'
    /// place (the default) or lays them out first as [`stage`](Self::stage) does.
    pub fn sends_in_place(&self) -> bool {
        self.in_place
    }

    /// Turns sending from the payloads' place on or off (for comparisons; the bytes on the
    /// wire are the same).
    pub fn set_send_in_place(&mut self, on: bool) {
        self.in_place = on;
    }

    /// PSN the next datagram gets.
    pub fn next_psn(&self) -> u32 {
        self.psn
    }

    /// Counters so far.
    pub fn stats(&self) -> &TxStats {
        &self.stats
    }

    /// The socket (for its bound address and buffer sizes).
    pub fn socket(&self) -> &TxSocket {
        &self.sock
    }

    /// Sends a prefix of `chunks` as one batch and says how many went.
    ///
    /// The batch ends at [`max_batch`](Self::max_batch) chunks, and (GSO needs equal segments,
    /// the last may be shorter) before a chunk longer than the first or after one shorter.
    /// Blocks while the socket buffer is full, up to the socket's
    /// [`SEND_TIMEOUT`](crate::socket::SEND_TIMEOUT) (then `TxError::Io` with
    /// `WouldBlock`, nothing of it sent).
    pub fn send_batch(&mut self, chunks: &[OutChunk<'_>]) -> Result<Sent, TxError> {
        let staged = self.stage(chunks)?;
        self.send_staged(staged)
    }

    /// Lays a prefix of `chunks` out in the staging buffer (headers, payload, ICRC) without
    /// sending it, the batch cut as [`send_batch`](Self::send_batch) cuts it: the payloads are
    /// copied once, so a caller may borrow them from a locked buffer and release the lock
    /// before [`send_staged`](Self::send_staged) blocks in the kernel. A second `stage`
    /// replaces the first.
    pub fn stage(&mut self, chunks: &[OutChunk<'_>]) -> Result<Staged, TxError> {
        let st = self.plan(chunks)?;
        for (i, c) in chunks[..st.n].iter().enumerate() {
            let ip_id = if st.gso { i as u16 } else { 0 };
            self.build(i, st.seg, c, ip_id);
        }
        Ok(st)
    }

    /// Sends a prefix of `chunks` as one batch, cut as [`send_batch`](Self::send_batch) cuts
    /// it, and says how many went. With GSO (and unless
    /// [`set_send_in_place`](Self::set_send_in_place) turned it off) the datagrams are
    /// gathered from the payloads where they lie: nothing is copied in user space, and the
    /// caller keeps the payloads borrowed while the kernel copies them, blocking while the
    /// socket buffer is full (up to [`SEND_TIMEOUT`](crate::socket::SEND_TIMEOUT)). Otherwise the batch is laid out and sent as `send_batch` does.
    ///
    /// If the kernel refuses a gathered GSO send (`EIO` or `EINVAL`: the device cannot
    /// segment), the batch is laid out and sent through quinn-udp instead, as are all later
    /// ones; quinn-udp then finds out about GSO for itself.
    pub fn send_in_place(&mut self, chunks: &[OutChunk<'_>]) -> Result<Sent, TxError> {
        if !self.in_place || !self.gso_active() {
            return self.send_batch(chunks);
        }
        let st = self.plan(chunks)?;
        if st.n == 0 {
            return Ok(Sent::default());
        }
        let chunks = &chunks[..st.n];
        for (i, c) in chunks.iter().enumerate() {
            let plen = c.payload.len();
            let pad = packet::pad_len(plen);
            let psn = self.psn.wrapping_add(i as u32);
            let head = &mut self.frames.heads[i];
            packet::emit_header_only(head, self.fields, psn, c.imm, plen);
            let tail = &mut self.frames.tails[i];
            tail[..pad].fill(0);
            // The kernel numbers a GSO batch's segments' IP IDs 0, 1, 2...; a lone datagram
            // goes without GSO, with ID 0.
            let ip_id = if st.n > 1 { i as u16 } else { 0 };
            let len = packet::datagram_len(plen);
            let icrc = self
                .icrc
                .compute_gathered(ip_id, len, &[head, c.payload, &tail[..pad]]);
            tail[pad..pad + packet::ICRC_LEN].copy_from_slice(&icrc.to_le_bytes());
        }
        let mut iov = [IoSlice::new(&[]); 3 * MAX_GSO_SEGMENTS];
        for (i, c) in chunks.iter().enumerate() {
            let trailer = packet::pad_len(c.payload.len()) + packet::ICRC_LEN;
            iov[3 * i] = IoSlice::new(&self.frames.heads[i]);
            iov[3 * i + 1] = IoSlice::new(c.payload);
            iov[3 * i + 2] = IoSlice::new(&self.frames.tails[i][..trailer]);
        }
        // A segment fits a datagram, checked at construction.
        let segment = (st.n > 1).then_some(st.seg as u16);
        let result = match self
            .sock
            .send_gathered(&iov[..3 * st.n], &self.dest, segment)
        {
            Ok(_) => Ok(st.n),
            Err(e)
                if segment.is_some()
                    && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) =>
            {
                tracing::info!(lane = self.cfg.lane, error = %e,
                    "gathered GSO send refused; laying batches out from now on");
                self.in_place = false;
                return self.send_batch(chunks);
            }
            Err(source) => Err(TxError::Io { sent: 0, source }),
        };
        self.stats.sends += 1;
        let sent = self.account(&st, result)?;
        self.stats.in_place += sent.chunks as u64;
        Ok(sent)
    }

    /// Cuts a batch from the front of `chunks` as [`send_batch`](Self::send_batch) does,
    /// without building it.
    fn plan(&self, chunks: &[OutChunk<'_>]) -> Result<Staged, TxError> {
        let Some(first) = chunks.first() else {
            return Ok(Staged::default());
        };
        let seg = packet::datagram_len(first.payload.len());
        let mut st = Staged {
            seg,
            gso: self.gso_active(),
            ..Staged::default()
        };
        for c in chunks.iter().take(self.max_batch()) {
            if c.payload.len() > self.cfg.max_payload {
                if st.n == 0 {
                    return Err(TxError::PayloadTooLarge {
                        len: c.payload.len(),
                        max: self.cfg.max_payload,
                    });
                }
                break;
            }
            let len = packet::datagram_len(c.payload.len());
            if len > seg {
                break;
            }
            st.end = st.n * seg + len;
            // At most `max_payload`, which fits a datagram (checked at construction).
            st.lens[st.n] = c.payload.len() as u16;
            st.n += 1;
            if len < seg {
                break;
            }
        }
        Ok(st)
    }

    /// Sends what [`stage`](Self::stage) laid out (its chunks are then the prefix `Sent`
    /// counts).
    pub fn send_staged(&mut self, st: Staged) -> Result<Sent, TxError> {
        let Staged {
            n, seg, end, gso, ..
        } = st;
        if n == 0 {
            return Ok(Sent::default());
        }
        let result = if gso && n > 1 {
            self.send_gso(seg, end, n)
        } else {
            self.send_each(seg, end, n)
        };
        self.account(&st, result)
    }

    /// Advances the PSN and the counters past the prefix of batch `st` that `result` says
    /// was sent.
    fn account(&mut self, st: &Staged, result: Result<usize, TxError>) -> Result<Sent, TxError> {
        let sent = match &result {
            Ok(k) => *k,
            Err(TxError::Io { sent, .. }) => *sent,
            Err(_) => 0,
        };
        // Only the last segment may be shorter, so a partly sent batch is `sent` full ones.
        let bytes = if sent == st.n { st.end } else { sent * st.seg };
        let payload: usize = st.lens[..sent].iter().map(|&l| usize::from(l)).sum();
        self.psn = (self.psn + sent as u32) & MASK_24;
        self.stats.datagrams += sent as u64;
        self.stats.udp_bytes += bytes as u64;
        self.stats.payload_bytes += payload as u64;
        result.map(|chunks| Sent { chunks, bytes })
    }

    /// Writes chunk `c` as datagram `index` of a batch with stride `seg`, PSN `psn + index`.
    fn build(&mut self, index: usize, seg: usize, c: &OutChunk<'_>, ip_id: u16) {
        let plen = c.payload.len();
        let len = packet::datagram_len(plen);
        let d = &mut self.staging[index * seg..index * seg + len];
        let psn = self.psn.wrapping_add(index as u32);
        packet::emit_headers(d, self.fields, psn, c.imm, plen);
        d[packet::PAYLOAD_AT..packet::PAYLOAD_AT + plen].copy_from_slice(c.payload);
        let icrc = self.icrc.compute(ip_id, d);
        d[len - packet::ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
    }

    fn send_gso(&mut self, seg: usize, end: usize, n: usize) -> Result<usize, TxError> {
        let transmit = Transmit {
            destination: SocketAddr::V4(self.cfg.group),
            ecn: None,
            contents: &self.staging[..end],
            segment_size: Some(seg),
            src_ip: None,
        };
        self.stats.sends += 1;
        match self.sock.send(&transmit) {
            Ok(()) => Ok(n),
            Err(e) if self.sock.max_gso_segments() <= 1 => {
                // quinn-udp switched GSO off (EIO/EINVAL): the ICRCs assumed IDs 0..n, so
                // restamp every segment with ID 0 and send them one by one.
                tracing::info!(lane = self.cfg.lane, error = %e, "GSO refused; sending without");
                self.stats.gso_fallbacks += 1;
                for i in 0..n {
                    let d = &mut self.staging[i * seg..((i + 1) * seg).min(end)];
                    let icrc = self.icrc.compute(0, d);
                    let len = d.len();
                    d[len - packet::ICRC_LEN..].copy_from_slice(&icrc.to_le_bytes());
                }
                self.send_each(seg, end, n)
            }
            Err(source) => Err(TxError::Io { sent: 0, source }),
        }
    }

    /// Sends the batch's `n` datagrams one `sendmsg` each.
    fn send_each(&mut self, seg: usize, end: usize, n: usize) -> Result<usize, TxError> {
        for i in 0..n {
            let transmit = Transmit {
                destination: SocketAddr::V4(self.cfg.group),
                ecn: None,
                contents: &self.staging[i * seg..((i + 1) * seg).min(end)],
                segment_size: None,
                src_ip: None,
            };
            self.stats.sends += 1;
            if let Err(source) = self.sock.send(&transmit) {
                return Err(TxError::Io { sent: i, source });
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A sender takes chunks up to the longest that fits a UDP datagram
    /// ([`crate::MAX_CHUNK_PAYLOAD`]), and refuses one byte more.
    #[test]
    fn the_longest_chunk_fits_a_datagram() {
        let cfg = |max_payload| TxConfig {
            lane: 0,
            group: SocketAddrV4::new(std::net::Ipv4Addr::new(239, 1, 2, 3), 4791),
            pkey: 0xFFFF,
            qkey: 1,
            rank: 0,
            max_payload,
            gso: false,
            initial_psn: 0,
        };
        let sock = || TxSocket::open(&crate::socket::SocketConfig::loopback()).unwrap();
        let max = crate::MAX_CHUNK_PAYLOAD;
        assert!(packet::datagram_len(max) <= MAX_UDP_PAYLOAD);
        assert!(LaneSender::new(sock(), cfg(max)).is_ok());
        for too_long in [max + 1, usize::MAX - 27, usize::MAX] {
            assert!(
                matches!(
                    LaneSender::new(sock(), cfg(too_long)),
                    Err(TxError::BadConfig(_))
                ),
                "{too_long}"
            );
        }
    }

    /// The kernel refuses GSO on a socket without UDP checksums (`EINVAL`), as it refuses it
    /// (`EIO`) on a device that cannot segment: the refused gathered batch is resent laid out,
    /// every later one is laid out too, and every datagram arrives with the right ICRC.
    #[test]
    fn a_refused_gathered_gso_send_is_resent_laid_out_and_arrives_whole() {
        let crate::rx::tests::Pair { mut tx, mut rx, .. } =
            crate::rx::tests::pair_with(0x5EED_00F1, |c| c.verify_icrc = true);
        // Loopback segments in software on every kernel with UDP GSO (4.18 on).
        assert!(tx.gso_active(), "no UDP GSO on loopback");
        crate::sys::no_udp_checksum(tx.sock.raw()).unwrap();
        const N: usize = 20;
        let payloads: Vec<Vec<u8>> = (0..N)
            .map(|k| {
                let len = if k == N - 1 { 1001 } else { 4096 };
                (0..len).map(|i| (k * 13 + i) as u8).collect()
            })
            .collect();
        let chunks: Vec<OutChunk<'_>> = payloads
            .iter()
            .enumerate()
            .map(|(k, p)| OutChunk {
                imm: k as u32,
                payload: p,
            })
            .collect();
        let mut at = 0;
        while at < N {
            at += tx.send_in_place(&chunks[at..]).unwrap().chunks;
        }
        let st = *tx.stats();
        assert!(!tx.sends_in_place(), "switched off for good: {st:?}");
        assert!(!tx.gso_active(), "quinn-udp found GSO refused too: {st:?}");
        // One by one after quinn-udp's own GSO try (refused, counted as a send and a
        // fallback); the refused gathered send is counted as neither.
        assert_eq!(
            (st.datagrams, st.in_place, st.gso_fallbacks, st.sends),
            (N as u64, 0, 1, N as u64 + 1)
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = [false; N];
        while got.iter().any(|g| !g) && Instant::now() < deadline {
            for c in rx.recv(Duration::from_millis(50)).unwrap().iter() {
                assert_eq!(c.payload, &payloads[c.imm as usize][..], "chunk {}", c.imm);
                got[c.imm as usize] = true;
            }
        }
        assert!(got.iter().all(|g| *g), "received {got:?}");
        assert_eq!(rx.stats().bad_icrc, 0, "{:?}", rx.stats());
    }
}
