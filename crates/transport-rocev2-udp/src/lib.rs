//! # ringcast-transport-rocev2-udp
//!
//! The default ringcast transport: every data datagram's UDP payload is a wire-exact RoCEv2 UD
//! `SEND_ONLY_WITH_IMMEDIATE` packet sent to one IPv4 multicast group per lane; the control path
//! and the fetch reads run over TCP between ranks.
//!
//! This crate's multicast data path, one piece per module:
//! * [`addr`]: groups and Q_Key from the job nonce;
//! * [`socket`]: socket2 setup of the per-lane receive and send sockets;
//! * [`tx`]: [`LaneSender`], one GSO send per batch: gathered from the payloads where they lie
//!   ([`LaneSender::send_in_place`], the engine's way), or laid out in a staging buffer;
//! * [`rx`]: [`LaneReceiver`], `recvmmsg` + GRO, checks and drop counters, zero-copy chunks,
//!   and reads that scatter a GRO batch's payloads straight to their place (the engine's way);
//! * [`pace`]: the token bucket and the single-rate AIMD controller (pure logic);
//! * [`icrc`]: the RoCEv2 invariant CRC.
//!
//! ## Threads
//! A [`LaneSender`] and a [`LaneReceiver`] each own their socket and buffers and take `&mut
//! self`: the engine gives each lane a send worker and a receive worker thread. The sender's
//! socket blocks when its buffer is full; the receiver waits with a timeout
//! ([`LaneReceiver::recv`]).
//!
//! ## One lane on loopback
//! ```
//! use std::time::Duration;
//! use ringcast_transport_rocev2_udp::{
//!     addr::{AddrConfig, JobAddrs}, LaneReceiver, LaneSender, OutChunk, RxConfig, RxSocket,
//!     SocketConfig, TxConfig, TxSocket,
//! };
//! let cfg = AddrConfig { port: 47_913, ..AddrConfig::default() };
//! let job = JobAddrs::derive(0xC0FFEE, 1, &cfg)?;
//! let group = job.group(0).unwrap();
//! let net = SocketConfig::loopback();
//! let mut rx = LaneReceiver::new(RxSocket::open(&net, group)?,
//!                                RxConfig::new(0, 0xFFFF, job.qkey(), 4096));
//! let mut tx = LaneSender::new(TxSocket::open(&net)?, TxConfig {
//!     lane: 0, group, pkey: 0xFFFF, qkey: job.qkey(), rank: 3, max_payload: 4096,
//!     gso: true, initial_psn: 0,
//! })?;
//! tx.send_batch(&[OutChunk { imm: 7, payload: b"hello" }])?;
//! let batch = rx.recv(Duration::from_secs(5))?;
//! let chunk = batch.iter().next().unwrap();
//! assert_eq!((chunk.rank, chunk.imm, chunk.payload), (3, 7, &b"hello"[..]));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod addr;
pub mod control;
pub mod icrc;
mod opbuf;
pub mod pace;
mod packet;
pub mod port;
pub mod rx;
pub mod socket;
mod sys;
pub use sys::{HUGE_PAGE, advise_huge_pages};
pub mod tx;

pub use control::{
    ControlConfig, ControlError, IoWait, IoWaker, Lander, Landing, MAX_DEFERRED_READS,
    MAX_FRAME_MESSAGE, MAX_FRAME_READ, OpBuffer, PeerLost, Registry, SEND_LOW_WATER, Taken,
    TcpControl,
};
pub use port::{PortError, UdpPort, UdpPortConfig, UdpRx, UdpTx};
pub use rx::{Chunk, LaneReceiver, RxBatch, RxConfig, RxError, RxStats};
pub use socket::{RxSocket, RxWaker, SocketConfig, SocketError, TxSocket};
pub use tx::{LaneSender, OutChunk, Sent, TxConfig, TxError, TxStats};

/// Puts the calling thread, a lane's receive worker, under Linux's `SCHED_BATCH`: the same
/// fair share of CPU, but its wake-ups do not preempt the thread running where it wakes.
///
/// A receive worker wakes once per GSO batch that arrives. Where ranks share cores (several
/// on one host, loopback), every such wake-up preempted the root's send worker, whose own
/// send had just woken it: 4 ranks on 2 cores, a 64 MiB Broadcast spread over 52-117 ms per
/// iteration and averaged 0.73-0.88 GB/s; with its receive workers under `SCHED_BATCH`,
/// 52-75 ms and 1.03-1.07 GB/s. On an idle core a waking worker runs at once either way.
pub fn batch_scheduling() -> std::io::Result<()> {
    sys::batch_scheduling()
}

/// Bytes each datagram carries besides the chunk payload (BTH 12, DETH 8, ImmDt 4, ICRC 4),
/// pad excluded.
pub const DATAGRAM_OVERHEAD: usize = packet::OVERHEAD;

/// UDP payload length of a datagram carrying `payload_len` bytes (pad and ICRC included).
pub const fn datagram_len(payload_len: usize) -> usize {
    packet::datagram_len(payload_len)
}

/// The longest chunk payload whose datagram fits in one UDP datagram over IPv4 (a lane's
/// sender refuses a longer `max_payload`).
pub const MAX_CHUNK_PAYLOAD: usize = (tx::MAX_UDP_PAYLOAD - packet::OVERHEAD) & !3;
