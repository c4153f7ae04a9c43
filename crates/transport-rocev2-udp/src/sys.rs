//! The one socket option neither std nor socket2 wraps: `SO_MEMINFO`, whose `SK_MEMINFO_DROPS`
//! entry is the kernel's per-socket drop counter (`sk_drops`, the `drops` column of
//! `/proc/net/udp`). Reading it is one `getsockopt`; reading `/proc/net/udp` walks every UDP
//! socket of the namespace, which cost a receive worker ~9 % of a core at one read per
//! operation (`perf`, 64 KiB Broadcasts back to back).
//!
//! And `SO_RCVBUFFORCE`, which lets a process with `CAP_NET_ADMIN` (root, or root in its
//! network namespace) set a receive buffer above `net.core.rmem_max` without changing that
//! host-wide setting.
//!
//! And `SCHED_BATCH` for a receive worker's thread ([`batch_scheduling`]), which std does not
//! wrap either.
//!
//! And a view of initialized bytes as the `MaybeUninit` buffers socket2's receive calls
//! take ([`recv_scatter`], [`peek`]): std has no safe conversion, because safe code could
//! write an uninitialized byte through it; here only the kernel writes through it.
//!
//! And a `UDP_SEGMENT` control message for a GSO send gathered from several buffers
//! ([`send_gathered`]): quinn-udp sends one contiguous buffer only.
//!
//! And `madvise(MADV_HUGEPAGE)` over memory not yet touched ([`advise_huge_pages`]), which
//! neither std nor socket2 has: the buffers the kernel copies datagrams into and out of,
//! backed by 2 MiB pages where the kernel's transparent huge pages are `madvise`.
//!
//! And `poll(2)` on an inline mesh's epoll descriptor ([`wait_readable`]), which waits for its
//! events without taking them (mio's poll takes them, and needs the mesh).
//!
//! And a `recv` into a vector's spare capacity ([`recv_spare`]), for a large frame of the TCP
//! mesh read straight into the vector that carries it on.
//!
//! And `IP_BLOCK_SOURCE` ([`block_source`]), which turns a membership away from one source
//! address: socket2 wraps source-specific joins, not blocks; and `IP_PKTINFO` off again
//! ([`no_packet_info`]), which quinn-udp turns on and socket2 does not wrap.
//!
//! This is the crate's only `unsafe`: five FFI calls (`getsockopt`, one `setsockopt` that
//! serves four options, `sched_setscheduler`, `poll`, `madvise`) with buffers they own or
//! borrow, that view, that control message, and that vector's length.
#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// `SO_MEMINFO` (asm-generic/socket.h; sparc numbers its options differently).
#[cfg(not(target_arch = "sparc64"))]
const SO_MEMINFO: libc::c_int = 55;
#[cfg(target_arch = "sparc64")]
const SO_MEMINFO: libc::c_int = 0x39;

/// Entries the kernel fills (`SK_MEMINFO_VARS`, 9 since Linux 4.6; older kernels fill fewer
/// and report how many through the length).
const VARS: usize = 9;

/// The kernel's drop counter of `sock` (`SK_MEMINFO_DROPS`); `Unsupported` on a kernel too old
/// to report it.
pub(crate) fn socket_drops(sock: &impl AsFd) -> io::Result<u64> {
    let mut info = [0u32; VARS];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    let fd = sock.as_fd().as_raw_fd();
    // The kernel truncates to the length given and writes back how much it wrote.
    // SAFETY: `fd` is an open socket borrowed for the call (`AsFd`); `info` is a live, writable
    // buffer of exactly `len` bytes, of which the kernel writes at most `len`; `len` is a live
    // `socklen_t`. Nothing is retained after the call returns.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let at = libc::SK_MEMINFO_DROPS as usize;
    if (len as usize) < (at + 1) * std::mem::size_of::<u32>() {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    }
    Ok(u64::from(info[at]))
}

/// Sets `sock`'s receive buffer to `bytes` past `net.core.rmem_max` (`SO_RCVBUFFORCE`);
/// `PermissionDenied` without `CAP_NET_ADMIN`.
pub(crate) fn force_recv_buffer(sock: &impl AsFd, bytes: usize) -> io::Result<()> {
    let val = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_option(sock, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &val)
}

/// `setsockopt(level, name)` on `sock` with `value`, a plain C value the option takes.
fn set_option<T: Copy>(
    sock: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let fd = sock.as_fd().as_raw_fd();
    // Every caller passes the option's C type; another `T` would be refused (`EINVAL`) or
    // read as the bytes it is, never past them.
    // SAFETY: `fd` is an open socket borrowed for the call (`AsFd`); `value` is a live `T`
    // and the length passed is exactly its size; the kernel only reads it during the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::from_ref(value).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Puts the calling thread under `SCHED_BATCH`: the same fair share of CPU as `SCHED_OTHER`
/// (same nice value), but its wake-ups do not preempt the thread running on the CPU it wakes
/// on. No privilege is needed.
pub(crate) fn batch_scheduling() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a live `sched_param` the kernel only reads during the call; pid 0
    // names the calling thread. Nothing is retained after the call returns.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &raw const param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits at most `timeout` (rounded up to whole milliseconds) for `fd` to be readable
/// (`poll(2)`, `POLLIN`), taking nothing from it: true if it is, false at the timeout or on a
/// signal.
pub(crate) fn wait_readable(fd: &impl AsRawFd, timeout: Duration) -> io::Result<bool> {
    let ms = timeout
        .as_micros()
        .div_ceil(1000)
        .min(libc::c_int::MAX as u128) as libc::c_int;
    poll_one(fd, libc::POLLIN, ms).map(|r| r & libc::POLLIN != 0)
}

/// Whether the peer of connected stream `fd` has closed its side (`poll(2)`'s `POLLRDHUP`,
/// or `POLLHUP`), looked at now, without waiting: seen even with bytes it sent before still
/// unread, where a `peek` sees only those bytes.
pub(crate) fn peer_closed(fd: &impl AsRawFd) -> io::Result<bool> {
    let hup = libc::POLLRDHUP | libc::POLLHUP;
    poll_one(fd, hup, 0).map(|r| r & hup != 0)
}

/// `poll(2)` of one descriptor for `events`, at most `ms` milliseconds: the events that
/// came (none at the timeout or on a signal).
fn poll_one(
    fd: &impl AsRawFd,
    events: libc::c_short,
    ms: libc::c_int,
) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is a live, writable `pollfd` and the count is 1: the kernel touches that
    // one entry, during the call only. A closed descriptor only reports `POLLNVAL` (and the
    // caller holds it open: `AsRawFd` of a value it has).
    let rc = unsafe { libc::poll(&raw mut pfd, 1, ms) };
    match rc {
        n if n > 0 => Ok(pfd.revents),
        0 => Ok(0),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(0)
            } else {
                Err(e)
            }
        }
    }
}

/// Most buffers one [`recv_scatter`] takes: a header, a payload and a trailer for each of 64
/// datagrams (a GRO super-packet of the smallest chunks), and one spare.
pub(crate) const MAX_SCATTER: usize = 3 * 64 + 1;

/// `bytes` as socket2's receive buffer type.
///
/// # Safety
/// SAFETY contract: only the kernel may write through the result (a receive call, which
/// writes initialized bytes); the caller must not write `MaybeUninit::uninit()` through it.
unsafe fn as_uninit(bytes: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    let len = bytes.len();
    // The caller's contract keeps the bytes initialized.
    // SAFETY: `MaybeUninit<u8>` has the size, alignment and validity of `u8`; the pointer and
    // length come from a live `&mut [u8]` whose borrow the result takes over, so nothing else
    // reaches those bytes meanwhile.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), len) }
}

/// What one [`recv_scatter`] read.
#[derive(Debug)]
pub(crate) struct Scattered {
    /// Bytes of the datagram (or GRO super-packet) written across the buffers.
    pub(crate) len: usize,
    /// Its source.
    pub(crate) from: socket2::SockAddr,
    /// Bytes of `control` the kernel filled.
    pub(crate) control_len: usize,
}

/// One non-blocking `recv` from `stream` into the spare capacity of `buf`, at most `max`
/// bytes, which then extend `buf`: a large frame is read straight into the vector it is handed
/// over in, with neither a zero fill first nor a copy after.
pub(crate) fn recv_spare(
    stream: &std::net::TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let n = max.min(spare.len());
    let got =
        socket2::SockRef::from(stream).recv_with_flags(&mut spare[..n], libc::MSG_DONTWAIT)?;
    // SAFETY: `recv` initialized the first `got` bytes of the spare capacity (the kernel
    // returns at most `n`, which is at most its length): they are now part of the vector.
    unsafe { buf.set_len(buf.len() + got.min(n)) };
    Ok(got)
}

/// One non-blocking `recvmsg` of one datagram (or GRO super-packet) across `bufs`, in order,
/// with its ancillary data in `control`. At most [`MAX_SCATTER`] buffers are used; bytes past
/// them are lost (a caller that must see every byte ends `bufs` with a 64 KiB spare).
pub(crate) fn recv_scatter(
    sock: &std::net::UdpSocket,
    bufs: &mut [&mut [u8]],
    control: &mut [u8],
) -> io::Result<Scattered> {
    let mut slices: [socket2::MaybeUninitSlice<'_>; MAX_SCATTER] =
        std::array::from_fn(|_| socket2::MaybeUninitSlice::new(&mut []));
    let n = bufs.len().min(MAX_SCATTER);
    for (s, b) in slices.iter_mut().zip(bufs.iter_mut()) {
        // SAFETY: the view goes to socket2's `recvmsg` only, through which the kernel writes
        // initialized bytes; it is dropped when this function returns.
        *s = socket2::MaybeUninitSlice::new(unsafe { as_uninit(b) });
    }
    // SAFETY: as above: the control buffer is written by the kernel only.
    let ctrl = unsafe { as_uninit(control) };
    // An IPv4 address for the kernel to overwrite (the socket is IPv4).
    let mut from = socket2::SockAddr::from(std::net::SocketAddrV4::new(
        std::net::Ipv4Addr::UNSPECIFIED,
        0,
    ));
    let mut msg = socket2::MsgHdrMut::new()
        .with_addr(&mut from)
        .with_buffers(&mut slices[..n])
        .with_control(ctrl);
    let len = socket2::SockRef::from(sock).recvmsg(&mut msg, libc::MSG_DONTWAIT)?;
    let control_len = msg.control_len();
    Ok(Scattered {
        len,
        from,
        control_len,
    })
}

/// The first `buf.len()` bytes of the datagram queued next, and its source, without taking
/// it (`MSG_PEEK`, non-blocking); the length is the datagram's if it is shorter.
pub(crate) fn peek(
    sock: &std::net::UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, socket2::SockAddr)> {
    let sock = socket2::SockRef::from(sock);
    // SAFETY: the view goes to socket2's `peek_from` only, through which the kernel writes
    // initialized bytes; it is dropped when the call returns. The socket is non-blocking.
    sock.peek_from(unsafe { as_uninit(buf) })
}

/// Space for one control message carrying a `u16` (`CMSG_SPACE(2)` is 24 bytes on 64-bit
/// Linux, 16 on 32-bit), aligned as a `cmsghdr` must be.
#[repr(C, align(8))]
struct SegmentControl([u8; 32]);

// SAFETY: `CMSG_SPACE` and `CMSG_LEN` are arithmetic on their argument only.
const SEGMENT_SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<u16>() as libc::c_uint) } as usize;
// SAFETY: as above.
const SEGMENT_LEN: usize = unsafe { libc::CMSG_LEN(size_of::<u16>() as libc::c_uint) } as usize;
const _: () = assert!(SEGMENT_SPACE <= size_of::<SegmentControl>());

/// One blocking `sendmsg` of `bufs`, in order, to `to`: as one datagram, or with `segment`
/// as a GSO batch the kernel cuts into datagrams of `segment` bytes (the last may be
/// shorter), with a `UDP_SEGMENT` control message. Returns the bytes sent (all of them: a
/// datagram socket sends a message whole or fails). A send a signal interrupted is made
/// again (a socket with `SO_SNDTIMEO` is not restarted by the kernel).
pub(crate) fn send_gathered(
    sock: &socket2::Socket,
    bufs: &[io::IoSlice<'_>],
    to: &socket2::SockAddr,
    segment: Option<u16>,
) -> io::Result<usize> {
    let msg = socket2::MsgHdr::new().with_addr(to).with_buffers(bufs);
    let send = |m: &socket2::MsgHdr<'_, '_, '_>| loop {
        match sock.sendmsg(m, 0) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    };
    let Some(segment) = segment else {
        return send(&msg);
    };
    let mut control = SegmentControl([0; 32]);
    let hdr = control.0.as_mut_ptr().cast::<libc::cmsghdr>();
    // `control` has room for a `cmsghdr` at its start (16 bytes on 64-bit Linux) followed by
    // its `u16` of data at `CMSG_DATA` (`CMSG_SPACE(2)` bytes in all, asserted at compile time
    // to fit); `cmsghdr` is plain data and the buffer starts zeroed.
    // SAFETY: `control` is a live, writable, 8-aligned buffer of 32 bytes holding all of it;
    // the header's fields are written through the aligned pointer, the data unaligned, and the
    // pointers do not outlive this block.
    unsafe {
        (*hdr).cmsg_len = SEGMENT_LEN as _;
        (*hdr).cmsg_level = libc::SOL_UDP;
        (*hdr).cmsg_type = libc::UDP_SEGMENT;
        std::ptr::write_unaligned(libc::CMSG_DATA(hdr).cast::<u16>(), segment);
    }
    send(&msg.with_control(&control.0[..SEGMENT_SPACE]))
}

/// Stops `sock`, a member of `group` on the interface with address `interface`, from taking
/// in datagrams whose IPv4 source is `source` (`IP_BLOCK_SOURCE`: the membership turns into
/// exclude mode). The kernel then skips the socket for them before cloning or queueing
/// anything, and counts no drop.
pub(crate) fn block_source(
    sock: &impl AsFd,
    group: std::net::Ipv4Addr,
    interface: std::net::Ipv4Addr,
    source: std::net::Ipv4Addr,
) -> io::Result<()> {
    let mreq = libc::ip_mreq_source {
        imr_multiaddr: libc::in_addr {
            s_addr: u32::from(group).to_be(),
        },
        imr_interface: libc::in_addr {
            s_addr: u32::from(interface).to_be(),
        },
        imr_sourceaddr: libc::in_addr {
            s_addr: u32::from(source).to_be(),
        },
    };
    set_option(sock, libc::IPPROTO_IP, libc::IP_BLOCK_SOURCE, &mreq)
}

/// The size of a transparent huge page (x86-64, and arm64 with 4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the whole [`HUGE_PAGE`]s inside `region` with transparent huge
/// pages (`madvise(MADV_HUGEPAGE)`), where its setting is `madvise` or `always`; best before
/// they are first touched, as the pages are chosen when they fault in. The contents stay as
/// they are. Returns the bytes advised: 0 when `region` holds no whole huge page. An error
/// where the kernel has no transparent huge pages (`EINVAL`).
pub fn advise_huge_pages<T>(region: &mut [std::mem::MaybeUninit<T>]) -> io::Result<usize> {
    let start = region.as_mut_ptr() as usize;
    let end = start.saturating_add(std::mem::size_of_val(region));
    let lo = start.div_ceil(HUGE_PAGE).saturating_mul(HUGE_PAGE);
    let hi = end / HUGE_PAGE * HUGE_PAGE;
    if hi <= lo {
        return Ok(0);
    }
    // `[lo, hi)` lies inside `region`, which the caller lends exclusively for the call.
    // SAFETY: `MADV_HUGEPAGE` changes only which pages back `[lo, hi)`: its contents,
    // mapping and protection stay as they are, so nothing any reference sees changes.
    let rc = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(hi - lo)
}

/// Stops `sock` from reporting each datagram's destination (`IP_PKTINFO` off), which
/// quinn-udp turns on: for every datagram it delivers to such a socket the kernel looks up
/// the address it arrived on (`fib_compute_spec_dst`), in the sender's softirq on loopback.
pub(crate) fn no_packet_info(sock: &impl AsFd) -> io::Result<()> {
    set_option(sock, libc::IPPROTO_IP, libc::IP_PKTINFO, &0 as &libc::c_int)
}

/// Turns the UDP checksum off on `sock` (`SO_NO_CHECK`), which makes the kernel refuse GSO
/// sends with `EINVAL`: a way to exercise the fallback without a device that cannot segment.
#[cfg(test)]
pub(crate) fn no_udp_checksum(sock: &impl AsFd) -> io::Result<()> {
    set_option(
        sock,
        libc::SOL_SOCKET,
        libc::SO_NO_CHECK,
        &1 as &libc::c_int,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    /// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            if let Some((a, b)) = range
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = (a..b).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_owned();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    fn whole_huge_pages_inside_a_buffer_are_advised() {
        let mut v: Vec<u8> = Vec::with_capacity(9 * HUGE_PAGE);
        let start = v.as_ptr() as usize;
        let lo = start.next_multiple_of(HUGE_PAGE);
        let hi = (start + 9 * HUGE_PAGE) / HUGE_PAGE * HUGE_PAGE;
        assert_eq!(advise_huge_pages(v.spare_capacity_mut()).unwrap(), hi - lo);
        assert!(hi - lo >= 8 * HUGE_PAGE);
        // `hg`: the mapping is advised (madvise splits it at the range's ends if it must).
        assert!(
            vm_flags(lo).split(' ').any(|f| f == "hg"),
            "{}",
            vm_flags(lo)
        );
        assert!(vm_flags(hi - 1).split(' ').any(|f| f == "hg"));
        // The contents stay as they are, and the buffer is usable as any.
        v.resize(9 * HUGE_PAGE, 7);
        assert!(v.iter().all(|&b| b == 7));
    }

    #[test]
    fn a_region_without_a_whole_huge_page_is_left_alone() {
        let mut v: Vec<u64> = Vec::with_capacity(HUGE_PAGE / 8 - 1);
        assert_eq!(advise_huge_pages(v.spare_capacity_mut()).unwrap(), 0);
        assert_eq!(advise_huge_pages::<u8>(&mut []).unwrap(), 0);
    }

    #[test]
    fn a_thread_goes_batch_without_privilege() {
        std::thread::spawn(|| {
            batch_scheduling().unwrap();
            // SAFETY (test): reads the calling thread's policy; no pointers involved.
            let policy = unsafe { libc::sched_getscheduler(0) };
            assert_eq!(policy, libc::SCHED_BATCH);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_fresh_socket_has_dropped_nothing() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(socket_drops(&s).unwrap(), 0);
    }

    #[test]
    fn drops_count_datagrams_a_full_buffer_refused() {
        let rx = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        rx.set_recv_buffer_size(4096).unwrap();
        rx.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        let to = rx.local_addr().unwrap().as_socket().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Far more than the smallest receive buffer holds; nobody reads.
        for _ in 0..200 {
            tx.send_to(&[7u8; 1024], to).unwrap();
        }
        let drops = socket_drops(&rx).unwrap();
        assert!(drops > 0, "no drop counted");
        assert!(drops < 200, "every datagram counted as dropped: {drops}");
    }

    #[test]
    fn a_forced_receive_buffer_is_granted_or_refused_for_want_of_rights() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sock = socket2::SockRef::from(&s);
        let want = 64 << 20;
        match force_recv_buffer(&s, want) {
            // Linux reports twice what was set (its bookkeeping included).
            Ok(()) => assert!(sock.recv_buffer_size().unwrap() >= want),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}"),
        }
    }
}
