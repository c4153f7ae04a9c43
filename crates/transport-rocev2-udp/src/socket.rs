//! Socket setup: one receive socket per lane, one unconnected send socket per lane.
//!
//! **One receive socket per lane**, bound to the lane's group address and port, rather than one
//! socket serving all lanes through `RecvMeta::dst_ip`:
//! * the engine runs one receive worker per lane; each owns its socket, so no worker demuxes for
//!   another and the kernel queues each lane separately (a slow lane cannot overrun a fast one);
//! * the socket's drop counter is then the lane's drop counter, which the pacing feedback needs;
//! * binding to the group (not `0.0.0.0`) makes the kernel deliver only that group's packets,
//!   even where `IP_MULTICAST_ALL` cannot be turned off; we turn it off as well.
//!
//! The price is one `recvmmsg` per lane instead of one for all lanes, which the per-lane threads
//! pay in parallel anyway.
//!
//! **Not one receive socket per sender** (a design left open, BENCHMARKS.md, twenty-sixth and
//! twenty-seventh rounds). Every send socket has a source port of its own, so a receive socket
//! `connect()`ed to one peer's send socket would take that peer's multicast only. Per lane and
//! peer, that would end two costs of an Allgather on a shared host. One is this rank's own
//! datagrams, which `IP_MULTICAST_LOOP` hands back and the filter trims: a build that dropped
//! them in the filter instead ran a 16 MiB-per-rank Allgather on loopback 5 % faster. The other
//! is the peeks that tell interleaved senders apart, about 4 % of its cycles; one sender per
//! socket would make every read-ahead guess right. (On loopback the first is now gone another
//! way: each rank sends from an address of its own and its receive sockets block it,
//! [`RxSocket::block_source`].) Against it:
//! * a datagram from anyone else (another job, a hostile sender: what the receive checks count
//!   by reason) reaches no connected socket. A catch-all socket would have to stay, its filter
//!   dropping the members' sources. Those drops are counted on that socket, not on the data
//!   sockets, so the pacer could still read the data sockets' drops as overruns;
//! * the kernel walks every socket bound to the port for each datagram: ranks x peers of them
//!   on a host (an 8-rank host of a 512-rank job: about 4 000), and each joins the group;
//! * a receive worker would wait on `P - 1` sockets per lane instead of one, and the
//!   start-up check would have to carry every rank's send ports.
//!
//! So it pays on hosts that run several ranks of a small job, the loopback benchmark's case,
//! and costs most where multicast matters most (many hosts, one rank each, where the own
//! datagrams do not come back at all). Not built.
//!
//! Setup order (NET-NOTES): socket2 options first, then quinn-udp's `UdpSocketState::new`
//! (non-blocking, `IP_PKTINFO`, `UDP_GRO`, `IP_PMTUDISC_PROBE` so DF is set), then `bind`, then
//! the membership. A receive socket turns `IP_PKTINFO` back off: bound to its group, it knows
//! every datagram's destination, and the kernel would look it up for each one it delivers.
//! The send socket is bound to the interface address, or on loopback to an address of the
//! rank's own ([`TxSocket::open_from`]): a known ICRC source address. It is never
//! `connect()`ed: a connected socket numbers IP IDs with a counter, which would break the ICRC
//! computed before sending.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

use quinn_udp::{RecvMeta, Transmit, UdpSocketState};
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, SockFilter, SockRef, Socket, Type};

/// Socket options shared by a rank's lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketConfig {
    /// Address of the interface multicast leaves and is joined on (`127.0.0.1` for loopback).
    /// Also the send socket's bound address, hence the ICRC's source address (unless it is
    /// opened [`from`](TxSocket::open_from) another).
    pub interface: Ipv4Addr,
    /// Multicast TTL (1 keeps it on the local subnet).
    pub ttl: u32,
    /// Deliver our own multicast to sockets on this host (`IP_MULTICAST_LOOP`): needed when
    /// several ranks share a host.
    pub multicast_loop: bool,
    /// Requested `SO_RCVBUF` per receive socket (default 32 MiB: a receive worker descheduled
    /// for a few ms must not lose what arrives meanwhile). The kernel caps it at
    /// `net.core.rmem_max` unless the process has `CAP_NET_ADMIN` (`SO_RCVBUFFORCE`).
    pub recv_buffer: usize,
    /// Requested `SO_SNDBUF` per send socket; capped at `net.core.wmem_max`.
    pub send_buffer: usize,
}

impl SocketConfig {
    /// Multicast on the interface with address `interface`, looped back to local ranks.
    pub const fn on_interface(interface: Ipv4Addr) -> Self {
        SocketConfig {
            interface,
            ttl: 1,
            multicast_loop: true,
            recv_buffer: 32 << 20,
            send_buffer: 1 << 20,
        }
    }

    /// Loopback multicast: works without root (`IP_MULTICAST_IF` 127.0.0.1, loop on).
    pub const fn loopback() -> Self {
        Self::on_interface(Ipv4Addr::LOCALHOST)
    }
}

/// A socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another socket holds the port without `SO_REUSEPORT`.
    #[error(
        "UDP port {port} is already in use (binding {addr}) by a socket without SO_REUSEPORT; \
         Soft-RoCE (rdma_rxe) holds 4791 when loaded: configure another port \
         (AddrConfig::port) or unload rdma_rxe"
    )]
    PortInUse {
        /// The address we tried to bind.
        addr: SocketAddrV4,
        /// The port in use.
        port: u16,
    },
    /// `SocketConfig::interface` was `0.0.0.0`.
    #[error("the multicast interface must be a concrete IPv4 address, not 0.0.0.0")]
    UnspecifiedInterface,
    /// Any other system call failure.
    #[error("{what}: {source}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> SocketError {
    move |source| SocketError::Io { what, source }
}

fn new_udp() -> Result<Socket, SocketError> {
    Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(io_err("socket"))
}

fn bind(sock: &Socket, addr: SocketAddrV4) -> Result<(), SocketError> {
    sock.bind(&SocketAddr::V4(addr).into()).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            SocketError::PortInUse {
                addr,
                port: addr.port(),
            }
        } else {
            SocketError::Io {
                what: "bind",
                source: e,
            }
        }
    })
}

/// The receive socket of one lane, joined to its group.
#[derive(Debug)]
pub struct RxSocket {
    sock: UdpSocket,
    state: UdpSocketState,
    group: SocketAddrV4,
    granted_recv_buffer: usize,
    inode: Option<u64>,
    /// Whether `SO_MEMINFO` reports the drop counter (else it is read from `/proc/net/udp`).
    drops_by_getsockopt: bool,
    /// Waits for the socket or the waker (mio: epoll with an eventfd).
    poll: mio::Poll,
    events: mio::Events,
    waker: RxWaker,
}

/// The socket's and the waker's tokens in [`RxSocket`]'s poll.
const SOCKET: mio::Token = mio::Token(0);
const WAKER: mio::Token = mio::Token(1);

/// Ends a receive worker's wait on its socket from another thread (the control thread, after
/// queuing it a command): [`LaneReceiver::recv`](crate::LaneReceiver::recv) then returns
/// at once, with whatever it read.
#[derive(Clone, Debug)]
pub struct RxWaker(Arc<mio::Waker>);

impl RxWaker {
    /// Wakes the socket's waiter (or its next wait, if none is waiting now).
    pub fn wake(&self) {
        if let Err(e) = self.0.wake() {
            tracing::warn!(error = %e, "waking a receive worker failed");
        }
    }
}

/// What ended a [`RxSocket::wait_readable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// A datagram is queued (or the socket has an error to report).
    Readable,
    /// The [`RxWaker`] was called.
    Woken,
    /// The timeout passed.
    TimedOut,
}

impl RxSocket {
    /// Binds `group` (address and port) with `SO_REUSEADDR`/`SO_REUSEPORT`, so that several
    /// ranks on a host share the port, and joins it on `cfg.interface`.
    pub fn open(cfg: &SocketConfig, group: SocketAddrV4) -> Result<Self, SocketError> {
        if cfg.interface.is_unspecified() {
            return Err(SocketError::UnspecifiedInterface);
        }
        let sock = new_udp()?;
        sock.set_reuse_address(true)
            .map_err(io_err("SO_REUSEADDR"))?;
        sock.set_reuse_port(true).map_err(io_err("SO_REUSEPORT"))?;
        sock.set_multicast_all_v4(false)
            .map_err(io_err("IP_MULTICAST_ALL"))?;
        sock.set_recv_buffer_size(cfg.recv_buffer)
            .map_err(io_err("SO_RCVBUF"))?;
        let mut granted_recv_buffer = sock.recv_buffer_size().map_err(io_err("SO_RCVBUF"))?;
        // Linux reports twice the size set (bookkeeping overhead included). Capped by
        // `net.core.rmem_max`: with `CAP_NET_ADMIN` the cap does not apply.
        if granted_recv_buffer < cfg.recv_buffer.saturating_mul(2)
            && crate::sys::force_recv_buffer(&sock, cfg.recv_buffer).is_ok()
        {
            granted_recv_buffer = sock.recv_buffer_size().map_err(io_err("SO_RCVBUF"))?;
        }
        if granted_recv_buffer < cfg.recv_buffer {
            tracing::warn!(
                requested = cfg.recv_buffer,
                granted = granted_recv_buffer,
                "receive buffer capped by net.core.rmem_max (raise it, or run with \
                 CAP_NET_ADMIN): receivers may be overrun at full rate"
            );
        }
        let state = UdpSocketState::new((&sock).into()).map_err(io_err("quinn-udp setup"))?;
        // The socket is bound to its group, so every datagram's destination is known.
        crate::sys::no_packet_info(&sock).map_err(io_err("IP_PKTINFO"))?;
        bind(&sock, group)?;
        sock.join_multicast_v4_n(group.ip(), &InterfaceIndexOrAddress::Address(cfg.interface))
            .map_err(io_err("IP_ADD_MEMBERSHIP"))?;
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", sock.as_raw_fd()))
            .ok()
            .map(|m| m.ino());
        sock.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))?;
        let poll = mio::Poll::new().map_err(io_err("epoll"))?;
        // Edge-triggered: `wait_readable` is only called after a read found the queue empty.
        poll.registry()
            .register(
                &mut mio::unix::SourceFd(&sock.as_raw_fd()),
                SOCKET,
                mio::Interest::READABLE,
            )
            .map_err(io_err("epoll_ctl"))?;
        let waker = RxWaker(Arc::new(
            mio::Waker::new(poll.registry(), WAKER).map_err(io_err("eventfd"))?,
        ));
        let drops_by_getsockopt = crate::sys::socket_drops(&sock).is_ok();
        tracing::debug!(%group, granted_recv_buffer, gro = state.gro_segments(), drops_by_getsockopt, "rx socket");
        Ok(RxSocket {
            sock: sock.into(),
            state,
            group,
            granted_recv_buffer,
            inode,
            drops_by_getsockopt,
            poll,
            events: mio::Events::with_capacity(4),
            waker,
        })
    }

    /// The group and port this socket receives.
    pub fn group(&self) -> SocketAddrV4 {
        self.group
    }

    /// `SO_RCVBUF` as the kernel granted it (Linux doubles the request, then caps it at twice
    /// `net.core.rmem_max`).
    pub fn granted_recv_buffer(&self) -> usize {
        self.granted_recv_buffer
    }

    /// Datagrams the kernel dropped on this socket (full receive buffer, `sk_drops`): one
    /// `getsockopt(SO_MEMINFO)`, cheap enough to call per operation. Where the kernel does not
    /// report it there, it is read from the `drops` column of `/proc/net/udp` (per socket and
    /// unprivileged, but a walk of every UDP socket: `UdpRcvbufErrors` in `/proc/net/snmp` is
    /// host-wide, and quinn-udp does not surface `SO_RXQ_OVFL`).
    pub fn socket_drops(&self) -> io::Result<u64> {
        match crate::sys::socket_drops(&self.sock) {
            Ok(d) => return Ok(d),
            Err(e) => tracing::trace!(error = %e, "SO_MEMINFO unavailable; reading /proc/net/udp"),
        }
        let inode = self
            .inode
            .ok_or_else(|| io::Error::other("socket inode unknown (no /proc?)"))?;
        // The kernel builds the table page by page; sockets opened or closed meanwhile can
        // shift a line out of the read, so a miss is retried.
        for _ in 0..4 {
            let table = std::fs::read_to_string("/proc/net/udp")?;
            if let Some(drops) = udp_drops(&table, inode) {
                return Ok(drops);
            }
        }
        Err(io::Error::other("socket not found in /proc/net/udp"))
    }

    /// Whether [`socket_drops`](Self::socket_drops) is one `getsockopt` (cheap enough to call
    /// every millisecond) rather than a walk of `/proc/net/udp`.
    pub fn socket_drops_cheap(&self) -> bool {
        self.drops_by_getsockopt
    }

    /// Stops this socket from taking in `source`'s datagrams (the rank's own send socket):
    /// with `IP_MULTICAST_LOOP` on (ranks sharing a host) the kernel loops every multicast
    /// back to every socket joined on the host, the sender's own receive socket included,
    /// which then copies each of its own datagrams out only to drop it (on loopback with 4
    /// ranks, a Broadcast root's receive worker spent 8 % of all CPU samples doing that).
    ///
    /// A classic BPF socket filter (`SO_ATTACH_FILTER`) trims a datagram whose IPv4 source
    /// address and UDP source port are `source`'s down to its UDP header, before it is
    /// queued: the read that follows copies nothing and sees an empty datagram (counted in
    /// [`RxStats::empty`](crate::RxStats::empty)). Trimmed, not dropped: a filter's drop
    /// counts in the socket's drop counter, which the pacer reads as overrun.
    pub fn ignore_source(&self, source: SocketAddrV4) -> Result<(), SocketError> {
        SockRef::from(&self.sock)
            .attach_filter(&own_source_filter(source))
            .map_err(io_err("SO_ATTACH_FILTER"))
    }

    /// Stops this socket from taking in any datagram whose IPv4 source address is `source`
    /// (`IP_BLOCK_SOURCE` on its membership, made on the interface with address
    /// `interface`): the kernel skips the socket for them before cloning or queueing
    /// anything, and counts no drop. Unlike [`ignore_source`](Self::ignore_source), which
    /// trims them after they were cloned for the socket, nothing of them reaches it; but it
    /// goes by address only, so it fits a send socket whose address no other rank on the
    /// host sends from ([`loopback_source`](crate::port::loopback_source)).
    pub fn block_source(&self, interface: Ipv4Addr, source: Ipv4Addr) -> Result<(), SocketError> {
        crate::sys::block_source(&self.sock, *self.group.ip(), interface, source)
            .map_err(io_err("IP_BLOCK_SOURCE"))
    }

    /// The socket, for this crate's own reads ([`crate::sys`]).
    pub(crate) fn udp(&self) -> &UdpSocket {
        &self.sock
    }

    /// One `recvmmsg` (non-blocking) into `bufs`.
    pub(crate) fn recv(
        &self,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        self.state.recv((&self.sock).into(), bufs, meta)
    }

    /// A handle that ends `wait_readable` from another thread.
    pub fn waker(&self) -> RxWaker {
        self.waker.clone()
    }

    /// Waits up to `timeout` for a datagram to be queued (call it only after a read found the
    /// queue empty: the wait is edge-triggered), or for the [`RxWaker`].
    pub(crate) fn wait_readable(&mut self, timeout: Duration) -> io::Result<Wait> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(Wait::TimedOut),
            Err(e) => return Err(e),
        }
        let mut wait = Wait::TimedOut;
        for e in &self.events {
            match e.token() {
                SOCKET => wait = Wait::Readable,
                WAKER if wait == Wait::TimedOut => wait = Wait::Woken,
                _ => {}
            }
        }
        Ok(wait)
    }
}

/// The filter of [`RxSocket::ignore_source`]. A socket filter on a UDP socket sees the
/// datagram from its UDP header on (offset 0: the source port), and the IPv4 header at
/// `SKF_NET_OFF` (offset 12: the source address); loads are in network byte order. It returns
/// how many bytes to keep: 1 trims to the 8-byte UDP header (the kernel's floor), `u32::MAX`
/// keeps all.
fn own_source_filter(source: SocketAddrV4) -> [SockFilter; 6] {
    const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // The IPv4 source address, relative to the network header (a negative offset, as the
    // kernel's `SKF_NET_OFF` convention has it, carried in the unsigned `k`).
    let net_src = (libc::SKF_NET_OFF + 12) as u32;
    [
        SockFilter::new(LD_H_ABS, 0, 0, 0),
        // Another port: skip to the last instruction (keep).
        SockFilter::new(JEQ_K, 0, 3, u32::from(source.port())),
        SockFilter::new(LD_W_ABS, 0, 0, net_src),
        SockFilter::new(JEQ_K, 0, 1, u32::from(*source.ip())),
        SockFilter::new(RET_K, 0, 0, 1),
        SockFilter::new(RET_K, 0, 0, u32::MAX),
    ]
}

/// The `drops` column of the `/proc/net/udp` line whose `inode` column is `inode`.
fn udp_drops(table: &str, inode: u64) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
        if cols.len() < 13 || cols[9].parse::<u64>().ok()? != inode {
            return None;
        }
        cols[12].parse().ok()
    })
}

/// How long one send waits for socket buffer space before it gives up with
/// [`io::ErrorKind::WouldBlock`] (`SO_SNDTIMEO`). Space comes back as the device drains the
/// queue, within microseconds; a send that waits this long meets a stuck send path (a NIC
/// paused by PFC, a wedged queue), and its worker must go back to its commands (a cancel,
/// its communicator's drop) rather than wait for ever.
pub const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);

/// The send socket of one lane: unconnected, bound to `interface:0`, DF set, blocking for at
/// most [`SEND_TIMEOUT`] per send.
#[derive(Debug)]
pub struct TxSocket {
    sock: Socket,
    state: UdpSocketState,
    local: SocketAddrV4,
    granted_send_buffer: usize,
}

impl TxSocket {
    /// Opens a send socket on `cfg.interface` with `IP_MULTICAST_IF`, `IP_MULTICAST_LOOP` and
    /// TTL set.
    ///
    /// It is left blocking: a send worker waits for socket buffer space instead of spinning,
    /// for up to [`SEND_TIMEOUT`] per send.
    pub fn open(cfg: &SocketConfig) -> Result<Self, SocketError> {
        Self::open_from(cfg, cfg.interface)
    }

    /// As [`open`](Self::open), bound to `source` instead of the interface's address (an
    /// address of the rank's own on loopback, [`loopback_source`](crate::port::loopback_source));
    /// multicast still leaves by `cfg.interface`.
    pub fn open_from(cfg: &SocketConfig, source: Ipv4Addr) -> Result<Self, SocketError> {
        if cfg.interface.is_unspecified() {
            return Err(SocketError::UnspecifiedInterface);
        }
        let sock = new_udp()?;
        sock.set_multicast_if_v4(&cfg.interface)
            .map_err(io_err("IP_MULTICAST_IF"))?;
        sock.set_multicast_loop_v4(cfg.multicast_loop)
            .map_err(io_err("IP_MULTICAST_LOOP"))?;
        sock.set_multicast_ttl_v4(cfg.ttl)
            .map_err(io_err("IP_MULTICAST_TTL"))?;
        sock.set_send_buffer_size(cfg.send_buffer)
            .map_err(io_err("SO_SNDBUF"))?;
        let granted_send_buffer = sock.send_buffer_size().map_err(io_err("SO_SNDBUF"))?;
        let state = UdpSocketState::new((&sock).into()).map_err(io_err("quinn-udp setup"))?;
        bind(&sock, SocketAddrV4::new(source, 0))?;
        sock.set_nonblocking(false).map_err(io_err("O_NONBLOCK"))?;
        sock.set_write_timeout(Some(SEND_TIMEOUT))
            .map_err(io_err("SO_SNDTIMEO"))?;
        let local = sock
            .local_addr()
            .map_err(io_err("getsockname"))?
            .as_socket_ipv4()
            .ok_or_else(|| SocketError::Io {
                what: "getsockname",
                source: io::Error::other("not an IPv4 address"),
            })?;
        tracing::debug!(%local, granted_send_buffer, gso = state.max_gso_segments(), "tx socket");
        Ok(TxSocket {
            sock,
            state,
            local,
            granted_send_buffer,
        })
    }

    /// The bound source address (the ICRC's IP source and UDP source port).
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// `SO_SNDBUF` as granted.
    pub fn granted_send_buffer(&self) -> usize {
        self.granted_send_buffer
    }

    /// Most segments one GSO send may carry (1 without GSO; quinn-udp lowers it to 1 after the
    /// kernel refuses a GSO send).
    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    pub(crate) fn send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.state.try_send((&self.sock).into(), transmit)
    }

    /// The socket itself (tests set options on it).
    #[cfg(test)]
    pub(crate) fn raw(&self) -> &Socket {
        &self.sock
    }

    /// One `sendmsg` gathered from `bufs`: one datagram, or a GSO batch of `segment`-byte
    /// datagrams (see [`crate::sys::send_gathered`]).
    pub(crate) fn send_gathered(
        &self,
        bufs: &[io::IoSlice<'_>],
        to: &socket2::SockAddr,
        segment: Option<u16>,
    ) -> io::Result<usize> {
        crate::sys::send_gathered(&self.sock, bufs, to, segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  123: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 5555 2 0000000000000000 0
  456: 030201EF:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 7777 2 0000000000000000 42
";

    #[test]
    fn parses_drops_by_inode() {
        assert_eq!(udp_drops(TABLE, 7777), Some(42));
        assert_eq!(udp_drops(TABLE, 5555), Some(0));
        assert_eq!(udp_drops(TABLE, 1), None);
        assert_eq!(udp_drops("", 1), None);
    }

    #[test]
    fn a_receive_socket_is_not_told_each_datagrams_destination() {
        // A group of this test's own: nobody else sends to it.
        let port = crate::rx::tests::fresh_port();
        let group = SocketAddrV4::new(Ipv4Addr::new(239, 77, 1, 9), port);
        let cfg = SocketConfig::loopback();
        let mut rx = RxSocket::open(&cfg, group).unwrap();
        let tx = TxSocket::open(&cfg).unwrap();
        tx.raw().send_to(b"hello", &group.into()).unwrap();
        let mut buf = [0u8; 64];
        let mut meta = [RecvMeta::default()];
        let n = loop {
            match rx.recv(&mut [io::IoSliceMut::new(&mut buf)], &mut meta) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    rx.wait_readable(Duration::from_secs(5)).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!((n, meta[0].len), (1, 5));
        assert_eq!(&buf[..5], b"hello");
        // quinn-udp turns IP_PKTINFO on; the kernel then looks up each datagram's
        // destination as it delivers it, for nothing: the group is the socket's.
        assert_eq!(meta[0].dst_ip, None);
    }

    #[test]
    fn unspecified_interface_is_refused() {
        let cfg = SocketConfig::on_interface(Ipv4Addr::UNSPECIFIED);
        assert!(matches!(
            TxSocket::open(&cfg),
            Err(SocketError::UnspecifiedInterface)
        ));
    }
}
