//! core's [`Port`] over this crate's data path and the TCP control path.
//!
//! * Receive halves ([`UdpRx`]) wrap a [`LaneReceiver`]. One `recvmmsg` batch stays in the
//!   receiver's buffers until the next read and is handed out from there one token at a time;
//!   a token's `consume` copies the payload into the registered operation buffer at the
//!   placement's offset: the only copy after the kernel's. The source rank is the DETH SrcQP;
//!   a chunk naming a rank outside the job is dropped and counted ([`UdpRx::bad_source`]).
//!   [`UdpRx::wait_with`] goes further: when the datagram queued next starts a run of chunks
//!   the lane expects ([`LaneRx::predict`](ringcast_core::lane::LaneRx::predict)), one
//!   `recvmsg` scatters its payloads straight into the operation's buffer, and their tokens
//!   have nothing left to copy.
//! * Send halves ([`UdpTx`]) wrap a [`LaneSender`]. A posted multicast is queued; the next
//!   `poll_send_done` sends queued multicasts in GSO batches (reading `len` bytes at `offset`
//!   of the registered buffer) and reports them done once the datagrams were handed to the
//!   kernel. A multicast of an unregistered op or an out-of-range slice, or one the socket
//!   refused, is counted and still reported done: the chunk is lost and the ring recovery
//!   repairs it, as for any lost datagram.
//! * Pacing hooks, for a send worker that owns its [`UdpTx`]: [`UdpTx::queued`],
//!   [`UdpTx::send_one_batch`] (one GSO batch, its bytes for the pacer to charge),
//!   [`UdpTx::take_done`] (completions without sending) and [`UdpTx::cancel`]. A receive
//!   worker sleeps in [`UdpRx::wait`] and hands out exactly the batch it read
//!   ([`UdpRx::held`]).
//! * Control: [`TcpControl`].
//!
//! Buffers are [`OpBuffer`]s in the shared [`Registry`]: register an operation's buffer right
//! after starting it on the node and before the next `pump`.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use ringcast_core::Rank;
use ringcast_core::lane::{Multicast, Run};
use ringcast_core::port::{Capabilities, LaneRxPort, LaneTxPort, Port, Ports, RxMeta, RxToken};
use ringcast_core::{OpId, Placement};

use crate::addr::{AddrConfig, AddrError, JobAddrs};
use crate::control::{OpBuffer, Registry, TcpControl, range};
use crate::rx::{Expect, LaneReceiver, MAX_DIRECT, Peeked, RxConfig};
use crate::socket::{RxSocket, SocketConfig, SocketError, TxSocket};
use crate::tx::{LaneSender, MAX_GSO_SEGMENTS, OutChunk, Sent, Staged, TxConfig, TxError};

/// What a rank's data path needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpPortConfig {
    /// This rank (the DETH SrcQP it sends).
    pub rank: u32,
    /// Ranks in the job.
    pub ranks: u32,
    /// Lanes (multicast groups).
    pub lanes: u16,
    /// The job nonce: groups and Q_Key derive from it.
    pub nonce: u64,
    /// Group prefix and UDP port.
    pub addr: AddrConfig,
    /// Socket options.
    pub socket: SocketConfig,
    /// Largest chunk payload (the core's chunk size).
    pub max_payload: usize,
    /// BTH P_Key.
    pub pkey: u16,
    /// Use GSO.
    pub gso: bool,
    /// Check every datagram's ICRC ([`RxConfig::verify_icrc`]). The kernel's UDP checksum
    /// already covers the whole UDP payload (headers, immediate, payload), so this catches
    /// only a sender that computes a wrong ICRC over a right checksum; it costs a CRC-32 of
    /// every datagram (about 15% of a receive worker's time in the namespace lab).
    pub verify_icrc: bool,
}

impl UdpPortConfig {
    /// Loopback multicast, default prefix, 4 KiB chunks, GSO on, ICRC checked.
    pub fn loopback(rank: u32, ranks: u32, lanes: u16, nonce: u64, port: u16) -> Self {
        UdpPortConfig {
            rank,
            ranks,
            lanes,
            nonce,
            addr: AddrConfig {
                port,
                ..AddrConfig::default()
            },
            socket: SocketConfig::loopback(),
            max_payload: 4096,
            pkey: 0xFFFF,
            gso: true,
            verify_icrc: true,
        }
    }
}

/// Opening the data path failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// Group derivation.
    #[error("addresses: {0}")]
    Addr(#[from] AddrError),
    /// Socket setup.
    #[error("socket: {0}")]
    Socket(#[from] SocketError),
    /// No group derived for a lane.
    #[error("no multicast group for lane {0}")]
    NoGroup(u16),
    /// Sender setup.
    #[error("sender: {0}")]
    Tx(#[from] TxError),
}

/// The first address of the range [`loopback_source`] hands out (127.77.0.1).
const LOOPBACK_SOURCES: u32 = 0x7F4D_0001;

/// The address a rank's send sockets bind to when its interface is a loopback address (and
/// multicast loops back to the ranks it shares the host with): an address of its own in
/// 127.0.0.0/8 (all of which is local), from 127.77.0.1 on by rank, so that its receive
/// sockets can turn away its own multicast by source address (`IP_BLOCK_SOURCE`,
/// [`RxSocket::block_source`]). `None` for any other interface (there, ranks on one host
/// share its address, and blocking it would turn away every one of them) and for ranks past
/// the range's end (from rank 11 730 942 on).
///
/// Two jobs on one host may use the same addresses: their groups differ (the job nonce), and
/// a membership's block covers its own group only.
pub fn loopback_source(interface: Ipv4Addr, rank: u32) -> Option<Ipv4Addr> {
    // Up to 127.255.255.254: 127.255.255.255 is 127.0.0.0/8's broadcast address.
    let a = LOOPBACK_SOURCES.checked_add(rank)?;
    (interface.is_loopback() && a < 0x7FFF_FFFF).then(|| Ipv4Addr::from(a))
}

/// Keeps `tx`'s own multicast, which `IP_MULTICAST_LOOP` hands back, out of `rx`: blocked by
/// source address where the send socket has an address of its own (`interface`: the one the
/// membership was made on), so the kernel skips the socket for it before cloning or queueing
/// anything; otherwise trimmed by a socket filter ([`RxSocket::ignore_source`]), so that the
/// read that follows copies nothing. Without either the rank still works: it reads its own
/// datagrams and the core drops them as its own.
fn ignore_own(rx: &RxSocket, tx: &TxSocket, interface: Option<Ipv4Addr>, lane: u16) {
    if let Some(interface) = interface {
        match rx.block_source(interface, *tx.local_addr().ip()) {
            Ok(()) => return,
            Err(e) => tracing::debug!(error = %e, lane, "own multicast not blocked by source"),
        }
    }
    if let Err(e) = rx.ignore_source(tx.local_addr()) {
        tracing::warn!(error = %e, lane, "own multicast not filtered");
    }
}

/// A rank's whole transport: lanes' sockets and the control mesh.
#[derive(Debug)]
pub struct UdpPort {
    caps: Capabilities,
    rx: Vec<UdpRx>,
    tx: Vec<UdpTx>,
    control: TcpControl,
}

impl UdpPort {
    /// Opens every lane's receive and send socket (joining the groups) over `control`, whose
    /// registry the lanes share.
    pub fn open(cfg: &UdpPortConfig, control: TcpControl) -> Result<Self, PortError> {
        if cfg.max_payload > crate::MAX_CHUNK_PAYLOAD {
            return Err(TxError::BadConfig("max_payload does not fit a UDP datagram").into());
        }
        let lanes = usize::from(cfg.lanes);
        let job = JobAddrs::derive(cfg.nonce, lanes, &cfg.addr)?;
        let registry = control.registry().clone();
        let mut rx = Vec::with_capacity(lanes);
        let mut tx = Vec::with_capacity(lanes);
        for l in 0..cfg.lanes {
            let group = job.group(usize::from(l)).ok_or(PortError::NoGroup(l))?;
            let own = cfg
                .socket
                .multicast_loop
                .then(|| loopback_source(cfg.socket.interface, cfg.rank))
                .flatten();
            let (tsock, own) = match own.map(|a| TxSocket::open_from(&cfg.socket, a)) {
                Some(Ok(t)) => (t, own),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, lane = l, "no send address of its own");
                    (TxSocket::open(&cfg.socket)?, None)
                }
                None => (TxSocket::open(&cfg.socket)?, None),
            };
            let rsock = RxSocket::open(&cfg.socket, group)?;
            if cfg.socket.multicast_loop {
                ignore_own(&rsock, &tsock, own.map(|_| cfg.socket.interface), l);
            }
            let recv = LaneReceiver::new(
                rsock,
                RxConfig {
                    verify_icrc: cfg.verify_icrc,
                    ..RxConfig::new(l, cfg.pkey, job.qkey(), cfg.max_payload)
                },
            );
            rx.push(UdpRx {
                recv,
                registry: registry.clone(),
                ranks: cfg.ranks,
                next: 0,
                batch: 0,
                cache: None,
                bad_source: 0,
                bad_place: 0,
                errors: 0,
                landed: None,
                direct_max: (crate::tx::MAX_UDP_PAYLOAD
                    / crate::packet::datagram_len(cfg.max_payload)
                    + 1)
                .clamp(1, MAX_DIRECT),
                moved: 0,
            });
            let sender = LaneSender::new(
                tsock,
                TxConfig {
                    lane: l,
                    group,
                    pkey: cfg.pkey,
                    qkey: job.qkey(),
                    rank: cfg.rank,
                    max_payload: cfg.max_payload,
                    gso: cfg.gso,
                    initial_psn: 0,
                },
            )?;
            tx.push(UdpTx {
                sender,
                registry: registry.clone(),
                posted: VecDeque::new(),
                done: VecDeque::new(),
                lost: 0,
                blocked: 0,
            });
        }
        Ok(UdpPort {
            caps: Capabilities {
                lanes: cfg.lanes,
                max_payload: cfg.max_payload as u32,
                places_payload: false,
                max_read: control.max_read(),
            },
            rx,
            tx,
            control,
        })
    }

    /// Control address table helper: the addresses of `listeners`, by rank.
    pub fn table(listeners: &[std::net::TcpListener]) -> std::io::Result<Vec<SocketAddr>> {
        listeners.iter().map(|l| l.local_addr()).collect()
    }
}

impl Port for UdpPort {
    type Rx = UdpRx;
    type Tx = UdpTx;
    type Control = TcpControl;

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn into_ports(self) -> Ports<UdpRx, UdpTx, TcpControl> {
        Ports {
            caps: self.caps,
            rx: self.rx,
            tx: self.tx,
            control: self.control,
        }
    }
}

/// One lane's receive half.
#[derive(Debug)]
pub struct UdpRx {
    recv: LaneReceiver,
    registry: Registry,
    ranks: u32,
    /// The next chunk of the receiver's last batch to hand out, and how many it holds.
    next: usize,
    batch: usize,
    /// The last operation's buffer, looked up once per batch (a released buffer is empty, so
    /// a write through a stale entry misses and is counted like an unregistered op).
    cache: Option<(OpId, OpBuffer)>,
    /// Chunks whose SrcQP names no rank of the job (dropped).
    pub bad_source: u64,
    /// Placements naming an unregistered op or a range outside its buffer (not written).
    pub bad_place: u64,
    /// Receive calls that failed.
    pub errors: u64,
    /// Where the last read laid its chunks straight into an operation's buffer: the run's
    /// operation and the byte offset of its first chunk.
    landed: Option<(OpId, u64)>,
    /// Most chunks one datagram can carry (a GRO super-packet of full chunks, and one more):
    /// a longer predicted run only lengthens the scatter list.
    direct_max: usize,
    /// Chunks received in place that the core placed elsewhere (copied there).
    pub moved: u64,
}

impl UdpRx {
    /// The lane receiver (counters, socket drops).
    pub fn receiver(&self) -> &LaneReceiver {
        &self.recv
    }

    /// A handle that ends this half's [`wait`](Self::wait) from another thread.
    pub fn waker(&self) -> crate::RxWaker {
        self.recv.waker()
    }

    /// Chunks read from the socket and not handed out yet.
    pub fn held(&self) -> usize {
        self.batch - self.next
    }

    /// Whether the last read found the socket empty ([`LaneReceiver::found_empty`]): a
    /// [`wait`](Self::wait) that holds nothing may instead have read only datagrams that were
    /// dropped (this rank's own trimmed multicast, another job's), with more queued behind
    /// them, or failed.
    pub fn found_empty(&self) -> bool {
        self.recv.found_empty()
    }

    /// Datagrams the kernel dropped on this lane's socket (one `getsockopt`); `None` where
    /// the counter cannot be read.
    pub fn socket_drops(&self) -> Option<u64> {
        self.recv.socket().socket_drops().ok()
    }

    /// Whether [`socket_drops`](Self::socket_drops) is cheap (one `getsockopt`).
    pub fn socket_drops_cheap(&self) -> bool {
        self.recv.socket().socket_drops_cheap()
    }

    /// Makes sure a batch is held, waiting up to `timeout` for one to arrive (a receive
    /// worker's sleep): returns [`held`](Self::held). Tokens then come from
    /// [`receive`](LaneRxPort::receive) without another socket read until the batch is out.
    /// Nothing held does not mean nothing queued: see [`found_empty`](Self::found_empty).
    pub fn wait(&mut self, timeout: std::time::Duration) -> usize {
        if self.held() == 0 {
            self.refill(Some(timeout));
        }
        self.held()
    }

    /// As [`wait`](Self::wait), but a datagram whose chunks `predict` places (the lane's
    /// [`LaneRx::predict`](ringcast_core::lane::LaneRx::predict): the sender's rank, the
    /// first chunk's immediate and the most chunks wanted in, the run of unclaimed chunks
    /// from it out) is received straight into the operation's buffer, with no copy after the
    /// kernel's ([`RxStats::direct`](crate::RxStats::direct) counts those chunks). The run's
    /// bytes are written under the buffer's lock, during one non-blocking `recvmsg`.
    ///
    /// One datagram (or GRO super-packet) a read when predicted, one batch otherwise.
    pub fn wait_with(
        &mut self,
        timeout: std::time::Duration,
        mut predict: impl FnMut(Rank, u32, u32) -> Option<Run>,
    ) -> usize {
        if self.held() > 0 {
            return self.held();
        }
        self.next = 0;
        self.batch = 0;
        self.landed = None;
        let UdpRx {
            recv,
            registry,
            cache,
            landed,
            ranks,
            direct_max,
            ..
        } = self;
        let mut place = InPlace {
            registry,
            cache,
            landed,
            ranks: *ranks,
            max: *direct_max,
        };
        if let Err(e) = recv.recv_by(timeout, |r| place.read_once(r, &mut predict)) {
            recv.clear();
            self.errors += 1;
            tracing::warn!(error = %e, "lane receive failed");
        }
        self.batch = self.recv.last_batch().len();
        self.held()
    }

    /// Reads the next batch into the receiver's buffers; the chunks are handed out from
    /// there, with no copy before the one into the operation's buffer.
    fn refill(&mut self, wait: Option<std::time::Duration>) {
        self.next = 0;
        self.batch = 0;
        self.cache = None;
        self.landed = None;
        let got = match wait {
            Some(t) => self.recv.recv(t).map(|b| b.len()),
            None => self.recv.try_recv().map(|b| b.len()),
        };
        match got {
            Ok(n) => self.batch = n,
            Err(e) => {
                self.errors += 1;
                tracing::warn!(error = %e, "lane receive failed");
            }
        }
    }
}

/// Empty datagrams one [`InPlace::read_once`] takes alone before it reads a batch.
const MAX_SKIPPED: usize = 16;

/// What [`UdpRx::wait_with`]'s reads need of the receive half beside its receiver.
struct InPlace<'a> {
    registry: &'a Registry,
    cache: &'a mut Option<(OpId, OpBuffer)>,
    landed: &'a mut Option<(OpId, u64)>,
    ranks: u32,
    max: usize,
}

impl InPlace<'_> {
    /// One read: straight into the operation's buffer when the datagram queued next starts
    /// a predicted run, else a batched read. The datagrams read (0: none queued).
    fn read_once(
        &mut self,
        recv: &mut LaneReceiver,
        predict: &mut impl FnMut(Rank, u32, u32) -> Option<Run>,
    ) -> std::io::Result<usize> {
        // Where the last read went on to, when all of it landed in place: a sender's GSO
        // batches follow each other (the next one, if it is not that, is only copied: see
        // `recv_into`), so it is read without a peek, a system call a datagram.
        if let Some((src_qp, imm)) = recv.follow()
            && let Some(n) = self.read_run(recv, predict, src_qp, imm, true)?
        {
            return Ok(n);
        }
        // This rank's own multicast comes back empty (trimmed), between its peers' chunks:
        // taken alone, so that the chunks behind it still land in place.
        let mut skipped = 0;
        let (src_qp, imm) = loop {
            match recv.peek()? {
                Peeked::Nothing => {
                    // What the batched read would have found: nothing, and no batch held.
                    recv.clear();
                    return Ok(skipped);
                }
                Peeked::Empty if skipped < MAX_SKIPPED => {
                    recv.skip_empty()?;
                    skipped += 1;
                }
                Peeked::Header { src_qp, imm } if src_qp < self.ranks => break (src_qp, imm),
                _ => return recv.read_batch(),
            }
        };
        match self.read_run(recv, predict, src_qp, imm, false)? {
            Some(n) => Ok(n),
            None => recv.read_batch(),
        }
    }

    /// One read straight into the operation's buffer, of the run `predict` gives from
    /// `src_qp`'s chunk with immediate `imm` on (`guess`: the receiver's
    /// [`follow`](LaneReceiver::follow), not a peeked header): the datagrams read, or `None`
    /// (nothing read) when there is no such run or it cannot be read in place.
    fn read_run(
        &mut self,
        recv: &mut LaneReceiver,
        predict: &mut impl FnMut(Rank, u32, u32) -> Option<Run>,
        src_qp: u32,
        imm: u32,
        guess: bool,
    ) -> std::io::Result<Option<usize>> {
        let Some(run) = predict(Rank(src_qp), imm, self.max as u32) else {
            return Ok(None);
        };
        if self.cache.as_ref().is_none_or(|(o, _)| *o != run.op) {
            *self.cache = self.registry.get(run.op).map(|b| (run.op, b));
        }
        let Some((_, buf)) = self.cache.as_ref() else {
            return Ok(None);
        };
        // `predict` gives at most `max` chunks; a longer run is refused by `recv_into`.
        let expect = Expect {
            src_qp,
            first_imm: imm,
            n: run.chunks as usize,
            chunk_len: run.chunk_len as usize,
            last_len: run.last_len as usize,
        };
        // Only the run's stripes are held during the read: the send workers (an
        // Allgather's own block) and the read service reach the rest meanwhile.
        let read = buf
            .view_mut(run.offset, expect.bytes() as u64, |t| {
                recv.recv_into(t, expect, guess)
            })
            .unwrap_or(Ok(None))?;
        if read.is_some() {
            *self.landed = Some((run.op, run.offset));
        }
        Ok(read)
    }
}

/// A received chunk, its payload in the [`UdpRx`]'s receive buffers.
#[derive(Debug)]
pub struct UdpToken<'a> {
    meta: RxMeta,
    payload: &'a [u8],
    /// The payload is already in `op`'s buffer at this offset (received in place).
    placed: Option<(OpId, u64)>,
    moved: &'a mut u64,
    registry: &'a Registry,
    cache: &'a mut Option<(OpId, OpBuffer)>,
    bad_place: &'a mut u64,
}

impl RxToken for UdpToken<'_> {
    fn meta(&self) -> RxMeta {
        self.meta
    }

    fn consume(self, placement: &Placement) -> bool {
        let Placement::Place { op, offset, len } = *placement else {
            return true;
        };
        if self.placed == Some((op, offset)) {
            // Received in place: nothing to copy.
            return true;
        }
        if self.cache.as_ref().is_none_or(|(o, _)| *o != op) {
            *self.cache = self.registry.get(op).map(|b| (op, b));
        }
        let ok = match (self.placed, self.cache.as_ref()) {
            // In place in `op`'s buffer, but the core puts it elsewhere (it cannot, for a
            // chunk that matched its prediction; kept whole rather than trusted).
            (Some((o, from)), Some((_, buf))) if o == op => {
                *self.moved += 1;
                buf.copy_within(from, offset, u64::from(len))
            }
            (Some(_), _) => false,
            (None, Some((_, buf))) => match self.payload.get(..len as usize) {
                Some(b) => buf.write_at(offset, b),
                None => false,
            },
            (None, None) => false,
        };
        if !ok {
            *self.bad_place += 1;
        }
        ok
    }
}

impl LaneRxPort for UdpRx {
    type Token<'a>
        = UdpToken<'a>
    where
        Self: 'a;

    fn receive(&mut self) -> Option<UdpToken<'_>> {
        if self.held() == 0 {
            self.refill(None);
        }
        loop {
            let c = self.recv.last_batch().get(self.next)?;
            self.next += 1;
            if c.rank >= self.ranks {
                self.bad_source += 1;
                continue;
            }
            let placed = match (c.placed, self.landed) {
                (Some(at), Some((op, base))) => Some((op, base + at as u64)),
                _ => None,
            };
            return Some(UdpToken {
                meta: RxMeta {
                    from: Rank(c.rank),
                    imm: c.imm,
                    len: c.len,
                },
                payload: c.payload,
                placed,
                moved: &mut self.moved,
                registry: &self.registry,
                cache: &mut self.cache,
                bad_place: &mut self.bad_place,
            });
        }
    }
}

/// One lane's send half.
#[derive(Debug)]
pub struct UdpTx {
    sender: LaneSender,
    registry: Registry,
    posted: VecDeque<Multicast>,
    done: VecDeque<(OpId, u32)>,
    /// Multicasts not sent: unregistered op, range outside the buffer, socket error.
    pub lost: u64,
    /// Sends that waited [`SEND_TIMEOUT`](crate::socket::SEND_TIMEOUT) for socket buffer space
    /// in vain (the send path stuck); their chunks stayed queued.
    pub blocked: u64,
}

impl UdpTx {
    /// The lane sender (counters).
    pub fn sender(&self) -> &LaneSender {
        &self.sender
    }

    /// Multicasts posted and not sent yet.
    pub fn queued(&self) -> usize {
        self.posted.len()
    }

    /// The next completion, without sending anything: the pacing hook. A paced send worker
    /// posts with [`post_multicast`](LaneTxPort::post_multicast), releases one batch with
    /// [`send_one_batch`](Self::send_one_batch) whenever its pacer allows, and takes
    /// completions here; [`poll_send_done`](LaneTxPort::poll_send_done) instead sends a batch
    /// whenever no completion is waiting (unpaced, for single-threaded drivers).
    pub fn take_done(&mut self) -> Option<(OpId, u32)> {
        self.done.pop_front()
    }

    /// Sends one batch of queued multicasts of one operation (at most
    /// [`LaneSender::max_batch`] chunks, one GSO send) and returns the UDP payload bytes
    /// handed to the kernel, for the pacer to charge; 0 when nothing was queued or sent.
    pub fn send_one_batch(&mut self) -> usize {
        let before = self.sender.stats().udp_bytes;
        self.flush_one();
        (self.sender.stats().udp_bytes - before) as usize
    }

    /// Drops the queued multicasts of `op` (it failed) and reports them done, so its
    /// buffer is read no more; returns how many were dropped. Batches already sent are
    /// not recalled.
    pub fn cancel(&mut self, op: OpId) -> u32 {
        let before = self.posted.len();
        self.posted.retain(|m| m.op != op);
        let n = (before - self.posted.len()) as u32;
        if n > 0 {
            self.done.push_back((op, n));
        }
        n
    }

    /// Whether batches are sent from the operation's buffer (the default) or laid out in a
    /// staging buffer first: see [`LaneSender::set_send_in_place`].
    pub fn set_send_in_place(&mut self, on: bool) {
        self.sender.set_send_in_place(on);
    }

    /// Sends one batch of queued multicasts of one op (up to the sender's batch size).
    ///
    /// A GSO batch is gathered straight from the operation's buffer by one `sendmsg` (the
    /// kernel's copy is the payload's only one), holding only the stripes of the buffer the
    /// batch covers (shared: other readers go on, and writers of other stripes). With
    /// in-place sending off, it is laid out from the buffer under those stripes instead (the
    /// payload's only copy in user space) and sent after they are released.
    ///
    /// A send that times out with the socket buffer full ([`SEND_TIMEOUT`]) ends the pass:
    /// the chunks it did not send stay queued, and only those before it are reported done.
    ///
    /// [`SEND_TIMEOUT`]: crate::socket::SEND_TIMEOUT
    fn flush_one(&mut self) {
        let Some(first) = self.posted.front().copied() else {
            return;
        };
        let max = self.sender.max_batch().min(MAX_GSO_SEGMENTS);
        let n = self
            .posted
            .iter()
            .take(max)
            .take_while(|m| m.op == first.op)
            .count();
        let buf = self.registry.get(first.op);
        let mut at = 0;
        while at < n {
            let (sender, posted) = (&mut self.sender, &self.posted);
            // The chunks from `at` on whose range lies in the buffer, up to the first that
            // does not (a lost chunk; an unregistered op has no valid range).
            let in_place = sender.sends_in_place() && sender.gso_active();
            let step = buf.as_ref().map(|b| {
                // The chunks from `at` on that lie in the buffer, up to the first that does
                // not, and the span of bytes they cover: only its stripes are held while the
                // batch is laid out or sent, so the receive workers (an Allgather), the other
                // lanes' send workers and the read service reach the rest meanwhile.
                let size = b.len();
                let (mut lo, mut hi, mut k) = (u64::MAX, 0, 0);
                for m in posted.range(at..n) {
                    let Some(r) = range(m.offset, u64::from(m.len), size) else {
                        break;
                    };
                    // Chunks far apart (repairs) go in batches of their own, so that one
                    // batch never holds much of the buffer.
                    if k > 0 && (r.end as u64).max(hi) - (r.start as u64).min(lo) > MAX_SPAN {
                        break;
                    }
                    lo = lo.min(r.start as u64);
                    hi = hi.max(r.end as u64);
                    k += 1;
                }
                if k == 0 {
                    return Step::Nothing;
                }
                b.view(lo, hi - lo, |v| {
                    let mut chunks = [OutChunk {
                        imm: 0,
                        payload: &[],
                    }; MAX_GSO_SEGMENTS];
                    for (c, m) in chunks.iter_mut().zip(posted.range(at..at + k)) {
                        let from = (m.offset - lo) as usize;
                        *c = OutChunk {
                            imm: m.imm,
                            payload: &v[from..from + m.len as usize],
                        };
                    }
                    if in_place {
                        Step::Sent(sender.send_in_place(&chunks[..k]))
                    } else {
                        match sender.stage(&chunks[..k]) {
                            Ok(s) if s.n > 0 => Step::Staged(s),
                            Ok(_) => Step::Nothing,
                            Err(e) => Step::Sent(Err(e)),
                        }
                    }
                })
                // Taken back (or resized) since: nothing of it can be sent.
                .unwrap_or(Step::Nothing)
            });
            let result = match step {
                Some(Step::Sent(r)) => r,
                Some(Step::Staged(s)) => self.sender.send_staged(s),
                // Out of the buffer, or no buffer: lost.
                Some(Step::Nothing) | None => {
                    at += 1;
                    self.lost += 1;
                    continue;
                }
            };
            match result {
                Ok(s) if s.chunks > 0 => at += s.chunks,
                Ok(_) => {
                    self.lost += (n - at) as u64;
                    at = n;
                    break;
                }
                Err(TxError::Io { sent, source }) if source.kind() == io::ErrorKind::WouldBlock => {
                    // The socket buffer stayed full for a whole `SEND_TIMEOUT`: the send path
                    // is stuck. The rest stays queued, to be sent when it moves again (or
                    // dropped by a cancel); the worker goes back to its commands meanwhile.
                    at += sent;
                    self.blocked += 1;
                    tracing::debug!("multicast send timed out: the send path is stuck");
                    break;
                }
                Err(TxError::Io { sent, source }) => {
                    tracing::debug!(error = %source, "multicast send failed");
                    // The failed chunk is lost; the ring recovery repairs it.
                    at += sent + 1;
                    self.lost += 1;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "multicast refused");
                    at += 1;
                    self.lost += 1;
                }
            }
        }
        // Every chunk before `at` was sent or lost; those from it on wait for the next try.
        let at = at.min(n);
        self.posted.drain(..at);
        if at > 0 {
            self.done.push_back((first.op, at as u32));
        }
    }
}

/// Most bytes one batch's chunks may span in the operation's buffer (a batch of chunks in a
/// row spans at most a GSO send's 64 KiB, whatever their size).
const MAX_SPAN: u64 = 256 << 10;

/// What one pass of [`UdpTx::flush_one`] did under the buffer's stripes.
enum Step {
    /// Sent from the buffer, or refused.
    Sent(Result<Sent, TxError>),
    /// Laid out, to send after the lock is released.
    Staged(Staged),
    /// No chunk from here on lies in the buffer.
    Nothing,
}

impl LaneTxPort for UdpTx {
    fn post_multicast(&mut self, m: &Multicast) {
        self.posted.push_back(*m);
    }

    fn poll_send_done(&mut self) -> Option<(OpId, u32)> {
        if self.done.is_empty() {
            self.flush_one();
        }
        self.done.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the block cannot be set (here: asked for on an address no interface has), the
    /// rank's own multicast is trimmed instead: it reaches the socket as empty
    /// datagrams, never as chunks.
    #[test]
    fn a_block_refused_falls_back_to_the_trimming_filter() {
        let cfg = SocketConfig::loopback();
        // A port nobody else has (the group is this test's alone).
        let port = crate::rx::tests::fresh_port();
        let group = std::net::SocketAddrV4::new(Ipv4Addr::new(239, 77, 0, 9), port);
        let own = loopback_source(cfg.interface, 0).unwrap();
        let tx = TxSocket::open_from(&cfg, own).unwrap();
        let rx = RxSocket::open(&cfg, group).unwrap();
        let elsewhere = Ipv4Addr::new(192, 0, 2, 1); // TEST-NET-1: no interface has it
        assert!(
            rx.block_source(elsewhere, own).is_err(),
            "no interface there"
        );
        ignore_own(&rx, &tx, Some(elsewhere), 0);
        tx.raw().send_to(&[1; 64], &group.into()).unwrap();
        let mut buf = [std::mem::MaybeUninit::new(0u8); 128];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let n = loop {
            match socket2::SockRef::from(rx.udp()).recv_from(&mut buf) {
                Ok((n, _)) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "nothing came");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(n, 0, "trimmed to its UDP header");
    }

    #[test]
    fn loopback_sources_are_ranks_own_and_only_on_loopback() {
        let lo = Ipv4Addr::LOCALHOST;
        assert_eq!(loopback_source(lo, 0), Some(Ipv4Addr::new(127, 77, 0, 1)));
        assert_eq!(loopback_source(lo, 256), Some(Ipv4Addr::new(127, 77, 1, 1)));
        // Any loopback interface address, not only 127.0.0.1.
        assert_eq!(
            loopback_source(Ipv4Addr::new(127, 0, 1, 1), 5),
            Some(Ipv4Addr::new(127, 77, 0, 6))
        );
        // The last rank whose address stays in 127.0.0.0/8, and the first past it.
        let last = 0x7FFF_FFFE - LOOPBACK_SOURCES;
        assert_eq!(last, 11_730_941);
        assert_eq!(
            loopback_source(lo, last),
            Some(Ipv4Addr::new(127, 255, 255, 254))
        );
        assert_eq!(loopback_source(lo, last + 1), None);
        assert_eq!(loopback_source(lo, u32::MAX), None);
        // A real interface: ranks on the host share its address.
        assert_eq!(loopback_source(Ipv4Addr::new(10, 77, 0, 2), 0), None);
    }
}
