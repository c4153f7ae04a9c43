//! Raw loopback multicast goodput, one sender to three receivers (threads), of this crate's
//! data path (GSO send, recvmmsg + GRO receive, all checks) against plain `std::net::UdpSocket`
//! `send_to` / `recv_from` with the same UDP datagram size.
//!
//! ```text
//! cargo run --release -p ringcast-transport-rocev2-udp --example goodput -- \
//!     [--payload 4096] [--secs 2] [--rate-mbps 0 (unpaced)] [--mode all|gso|nogso|std] \
//!     [--sched batch|other] [--deliver BYTES] [--source BYTES] [--pages small|huge] [--lanes N]
//! ```
//! Prints, per mode, the sender's rate and each receiver's goodput (UDP payload bytes received
//! per second, from the first send to the receiver's last datagram) and loss.
//!
//! Across hosts or network namespaces (`cargo xtask bench-net` runs it this way), one process
//! per role, on the interface with address `--iface`:
//! ```text
//! goodput --role recv --iface 10.77.0.2 --port 4791 [--secs 2]   # in each receiver's namespace
//! goodput --role send --iface 10.77.0.1 --port 4791 [--secs 2]   # then the sender
//! ```
//! A receiver prints one `GOODPUT` line: UDP bytes received per second from its first datagram
//! to its last, the datagrams accepted and the socket's kernel drops; the sender prints `SENT`.
//!
//! Receivers run under `SCHED_BATCH` (`--sched batch`, the default), as ringcast's receive
//! workers do ([`batch_scheduling`](ringcast_transport_rocev2_udp::batch_scheduling)), so
//! that the ceiling gets the same scheduling as what it bounds; `--sched other` leaves them
//! under `SCHED_OTHER`.
//!
//! `--deliver BYTES`: each receiver also copies every payload it accepts into a buffer of
//! `BYTES` (say, a 64 MiB Broadcast's), in turn from its start, as an application that keeps
//! what it receives must. Without it the receivers discard the payloads, so the kernel only
//! ever writes their 2 MiB of receive slots, which stay in cache: the raw ceiling. With it,
//! each receiver also writes a message-sized buffer that does not fit in cache, as
//! ringcast's receive workers do.
//!
//! `--source BYTES`: the sender takes its payloads in turn from a buffer of `BYTES` (say, a
//! 64 MiB Broadcast's), as a Broadcast's root reads its buffer, instead of sending one
//! payload that stays in cache over and over.
//!
//! `--pages huge`: the `--source` and `--deliver` buffers on 2 MiB transparent huge pages
//! ([`advise_huge_pages`](ringcast_transport_rocev2_udp::advise_huge_pages), what
//! `ringcast::alloc_buffer` gives a caller), for a ringcast whose caller allocates that way.
//!
//! `--lanes N` (the ringcast modes on loopback): as ringcast's lanes do, N groups, each with
//! a sender thread of its own and, at every receiver, a receiving thread and socket of its
//! own; a lane's sender takes its payloads from its Nth of the `--source` buffer and a lane's
//! receiving thread keeps them in its Nth of the `--deliver` one. A receiver's goodput is the
//! sum over its lanes: the ceiling of a Broadcast that runs on N lanes, where one sender
//! thread no longer bounds it.

#![allow(clippy::print_stdout)]

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ringcast_transport_rocev2_udp::addr::{AddrConfig, JobAddrs};
use ringcast_transport_rocev2_udp::pace::Pacer;
use ringcast_transport_rocev2_udp::{
    LaneReceiver, LaneSender, OutChunk, RxConfig, RxSocket, SocketConfig, TxConfig, TxSocket,
    datagram_len,
};
use socket2::{Domain, InterfaceIndexOrAddress, Protocol, Socket, Type};

const RECEIVERS: usize = 3;
const QUIET: Duration = Duration::from_millis(200);

struct Args {
    payload: usize,
    secs: f64,
    rate_mbps: f64,
    mode: String,
    role: Option<String>,
    iface: Ipv4Addr,
    port: u16,
    /// Receivers under `SCHED_BATCH`.
    batch: bool,
    /// Bytes of each receiver's delivery buffer (0: payloads discarded).
    deliver: usize,
    /// Bytes of the buffer the sender takes its payloads from (0: one payload, resent).
    source: usize,
    /// Groups, each with its own sender and receiving threads.
    lanes: usize,
    /// The `--source` and `--deliver` buffers on transparent huge pages.
    huge: bool,
}

/// A buffer of `bytes` copies of `fill`, on huge pages if asked.
fn buffer(bytes: usize, fill: u8, huge: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes);
    if huge && let Err(e) = ringcast_transport_rocev2_udp::advise_huge_pages(v.spare_capacity_mut())
    {
        println!("goodput: --pages huge: {e}; the buffer stays on small pages");
    }
    v.resize(bytes, fill);
    v
}

/// Where a receiver copies its payloads with `--deliver` (round robin over the buffer).
struct Sink {
    buf: Vec<u8>,
    at: usize,
}

impl Sink {
    fn new(bytes: usize, huge: bool) -> Option<Self> {
        (bytes > 0).then(|| Sink {
            buf: buffer(bytes, 1, huge),
            at: 0,
        })
    }

    fn take(&mut self, batch: ringcast_transport_rocev2_udp::RxBatch<'_>) {
        for c in batch.iter() {
            let n = c.payload.len();
            if self.at + n > self.buf.len() {
                self.at = 0;
            }
            if let Some(d) = self.buf.get_mut(self.at..self.at + n) {
                d.copy_from_slice(c.payload);
                self.at += n;
            }
        }
    }
}

fn deliver(sink: &mut Option<Sink>, batch: ringcast_transport_rocev2_udp::RxBatch<'_>) -> usize {
    if let Some(s) = sink {
        s.take(batch);
    }
    batch.len()
}

/// Puts the calling receiver under `SCHED_BATCH` when asked.
fn receiver_sched(batch: bool) {
    if batch {
        ringcast_transport_rocev2_udp::batch_scheduling().expect("SCHED_BATCH");
    }
}

const USAGE: &str = "usage: goodput [--payload BYTES] [--secs S] [--rate-mbps MB/s] \
[--mode all|gso|nogso|std] [--sched batch|other] [--deliver BYTES] [--source BYTES] \
[--pages small|huge] [--lanes N] [--role send|recv --iface IPv4 --port PORT]";

/// The arguments, or what is wrong with them.
fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        payload: 4096,
        secs: 2.0,
        rate_mbps: 0.0,
        mode: "all".into(),
        role: None,
        iface: Ipv4Addr::LOCALHOST,
        port: 4791,
        batch: true,
        deliver: 0,
        source: 0,
        lanes: 1,
        huge: false,
    };
    fn num<T: std::str::FromStr>(k: &str, v: &str) -> Result<T, String> {
        v.parse().map_err(|_| format!("{k}: cannot read {v:?}"))
    }
    while let Some(k) = it.next() {
        if k == "-h" || k == "--help" {
            return Err(String::new());
        }
        let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--payload" => a.payload = num(&k, &v)?,
            "--secs" => a.secs = num(&k, &v)?,
            "--rate-mbps" => a.rate_mbps = num(&k, &v)?,
            "--iface" => a.iface = num(&k, &v)?,
            "--port" => a.port = num(&k, &v)?,
            "--deliver" => a.deliver = num(&k, &v)?,
            "--source" => a.source = num(&k, &v)?,
            "--lanes" => a.lanes = num(&k, &v)?,
            "--mode" if ["all", "gso", "nogso", "std"].contains(&v.as_str()) => a.mode = v,
            "--role" if v == "send" || v == "recv" => a.role = Some(v),
            "--sched" if v == "batch" || v == "other" => a.batch = v == "batch",
            "--pages" if v == "small" || v == "huge" => a.huge = v == "huge",
            "--mode" | "--role" | "--sched" | "--pages" => {
                return Err(format!("{k}: unknown value {v:?}"));
            }
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.payload == 0 {
        return Err("--payload: at least 1 byte".to_owned());
    }
    if !(1..=64).contains(&a.lanes) {
        return Err("--lanes: 1 to 64".to_owned());
    }
    if a.lanes > 1 && a.role.is_some() {
        return Err("--lanes: on loopback only, not with --role".to_owned());
    }
    Ok(a)
}

/// The arguments; usage (and exit status 2 on a mistake) otherwise.
fn args() -> Args {
    match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            std::process::exit(0)
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "goodput: {e}\n{USAGE}");
            std::process::exit(2)
        }
    }
}

struct RxResult {
    bytes: u64,
    datagrams: u64,
    last: Instant,
    socket_drops: u64,
}

struct Run {
    sent_datagrams: u64,
    sent_bytes: u64,
    send_secs: f64,
    start: Instant,
    rx: Vec<RxResult>,
}

fn report(name: &str, udp_len: usize, run: &Run) {
    let gbps = |bytes: u64, secs: f64| bytes as f64 * 8.0 / secs / 1e9;
    println!(
        "{name:<22} datagram {udp_len} B: sent {} in {:.2} s = {:.2} Gb/s",
        run.sent_datagrams,
        run.send_secs,
        gbps(run.sent_bytes, run.send_secs)
    );
    let mut total = 0.0;
    for (i, r) in run.rx.iter().enumerate() {
        let secs = r.last.duration_since(run.start).as_secs_f64().max(1e-9);
        let g = gbps(r.bytes, secs);
        total += g;
        let loss = 100.0 * (1.0 - r.datagrams as f64 / run.sent_datagrams.max(1) as f64);
        println!(
            "    receiver {i}: {g:.2} Gb/s goodput, {} datagrams, loss {loss:.1}% (socket drops {})",
            r.datagrams, r.socket_drops
        );
    }
    println!(
        "    mean per receiver {:.2} Gb/s",
        total / run.rx.len() as f64
    );
}

fn pacer(a: &Args) -> Option<(Pacer, Instant)> {
    (a.rate_mbps > 0.0).then(|| {
        let epoch = Instant::now();
        let p = Pacer::new(
            ringcast_core::Instant::ZERO,
            (a.rate_mbps * 1e6) as u64,
            256 << 10,
        );
        (p, epoch)
    })
}

fn core_now(epoch: Instant) -> ringcast_core::Instant {
    ringcast_core::Instant::from_nanos(epoch.elapsed().as_nanos() as u64)
}

/// Sleeps until the pacer releases the next batch (yielding on waits too short to sleep: the
/// bucket's depth absorbs sleep overshoot).
fn wait_paced(p: &mut Option<(Pacer, Instant)>) {
    if let Some((pacer, epoch)) = p {
        while let Some(at) = pacer.poll_release(core_now(*epoch)) {
            let ns = at.as_nanos().saturating_sub(core_now(*epoch).as_nanos());
            if ns > 20_000 {
                thread::sleep(Duration::from_nanos(ns));
            } else {
                thread::yield_now();
            }
        }
    }
}

fn charge(p: &mut Option<(Pacer, Instant)>, bytes: usize) {
    if let Some((pacer, epoch)) = p {
        pacer.on_sent(core_now(*epoch), bytes);
    }
}

/// Lane 0's group and the job's addresses for `nonce` on UDP `port`.
fn lane0(nonce: u64, port: u16) -> (JobAddrs, SocketAddrV4) {
    let (job, groups) = lane_groups(nonce, port, 1);
    (job, groups[0])
}

/// The job's addresses for `nonce` on UDP `port`, and its `lanes` groups.
fn lane_groups(nonce: u64, port: u16, lanes: usize) -> (JobAddrs, Vec<SocketAddrV4>) {
    let job = JobAddrs::derive(
        nonce,
        lanes,
        &AddrConfig {
            port,
            ..AddrConfig::default()
        },
    )
    .expect("groups");
    let groups = (0..lanes).map(|l| job.group(l).expect("lane")).collect();
    (job, groups)
}

/// A ringcast sender to lane `lane`'s `group` as rank 0.
fn lane_sender(
    net: &SocketConfig,
    job: &JobAddrs,
    (lane, group): (u16, SocketAddrV4),
    a: &Args,
    gso: bool,
) -> LaneSender {
    LaneSender::new(
        TxSocket::open(net).expect("tx socket"),
        TxConfig {
            lane,
            group,
            pkey: 0xFFFF,
            qkey: job.qkey(),
            rank: 0,
            max_payload: a.payload,
            gso,
            initial_psn: 0,
        },
    )
    .expect("sender")
}

/// Sends full 64-chunk batches (paced when `--rate-mbps` is set) until `a.secs` after `start`,
/// their payloads in turn from a buffer of `source` bytes (at least a payload).
fn send_for(tx: &mut LaneSender, a: &Args, start: Instant, source: usize) {
    let source = buffer(source.max(a.payload), 0xA5, a.huge);
    let slots = source.len() / a.payload;
    let mut at = 0;
    let mut chunks: Vec<OutChunk<'_>> = Vec::with_capacity(64);
    let mut p = pacer(a);
    let until = start + Duration::from_secs_f64(a.secs);
    while Instant::now() < until {
        chunks.clear();
        for k in 0..64 {
            chunks.push(OutChunk {
                imm: k,
                payload: &source[at * a.payload..][..a.payload],
            });
            at = (at + 1) % slots;
        }
        wait_paced(&mut p);
        let sent = tx.send_batch(&chunks).expect("send");
        charge(&mut p, sent.bytes);
    }
}

/// One receiving thread's socket read until the sender is done and the socket stays quiet.
fn receive_until_quiet(
    mut rx: LaneReceiver,
    done: &AtomicBool,
    start: Instant,
    a: (bool, usize, bool),
    udp_len: usize,
) -> RxResult {
    let (batch, bytes, huge) = a;
    receiver_sched(batch);
    let mut sink = Sink::new(bytes, huge);
    let mut last = start;
    let mut quiet_since = None::<Instant>;
    loop {
        let n = deliver(&mut sink, rx.recv(Duration::from_millis(20)).expect("recv"));
        if n > 0 {
            last = Instant::now();
            quiet_since = None;
        } else if done.load(Ordering::Acquire) {
            let q = *quiet_since.get_or_insert_with(Instant::now);
            if q.elapsed() > QUIET {
                break;
            }
        }
    }
    let s = *rx.stats();
    RxResult {
        // Every chunk is full: UDP bytes = chunks x datagram length.
        bytes: s.accepted * udp_len as u64,
        datagrams: s.accepted,
        last,
        socket_drops: rx.socket().socket_drops().unwrap_or(0),
    }
}

fn run_ringcast(a: &Args, nonce: u64, gso: bool) -> Run {
    let lanes = a.lanes;
    let (job, groups) = lane_groups(nonce, free_port(), lanes);
    let net = SocketConfig::loopback();
    // Receiver r's lane l: its own socket and thread.
    let mut rxs = Vec::new();
    for _ in 0..RECEIVERS {
        for (l, &group) in groups.iter().enumerate() {
            let sock = RxSocket::open(&net, group).expect("rx socket");
            rxs.push(LaneReceiver::new(
                sock,
                RxConfig::new(l as u16, 0xFFFF, job.qkey(), a.payload),
            ));
        }
    }
    println!(
        "(receive buffer granted: {} B)",
        rxs[0].socket().granted_recv_buffer()
    );
    let txs: Vec<LaneSender> = (0..lanes)
        .map(|l| lane_sender(&net, &job, (l as u16, groups[l]), a, gso))
        .collect();
    let udp_len = datagram_len(a.payload);
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let rx_cfg = (a.batch, a.deliver / lanes, a.huge);
    let workers: Vec<_> = rxs
        .into_iter()
        .map(|rx| {
            let done = done.clone();
            thread::spawn(move || receive_until_quiet(rx, &done, start, rx_cfg, udp_len))
        })
        .collect();
    let source = a.source / lanes;
    let (send_secs, sent) = thread::scope(|s| {
        let senders: Vec<_> = txs
            .into_iter()
            .map(|mut tx| {
                s.spawn(move || {
                    send_for(&mut tx, a, start, source);
                    (start.elapsed().as_secs_f64(), *tx.stats())
                })
            })
            .collect();
        let ends: Vec<_> = senders
            .into_iter()
            .map(|h| h.join().expect("sender"))
            .collect();
        let secs = ends.iter().map(|e| e.0).fold(0.0, f64::max);
        let datagrams = ends.iter().map(|e| e.1.datagrams).sum::<u64>();
        let bytes = ends.iter().map(|e| e.1.udp_bytes).sum::<u64>();
        (secs, (datagrams, bytes))
    });
    done.store(true, Ordering::Release);
    let per_lane: Vec<RxResult> = workers
        .into_iter()
        .map(|w| w.join().expect("receiver"))
        .collect();
    // A receiver is the sum of its lanes.
    let rx = per_lane
        .chunks(lanes)
        .map(|ls| RxResult {
            bytes: ls.iter().map(|r| r.bytes).sum(),
            datagrams: ls.iter().map(|r| r.datagrams).sum(),
            last: ls.iter().map(|r| r.last).max().unwrap_or(start),
            socket_drops: ls.iter().map(|r| r.socket_drops).sum(),
        })
        .collect();
    Run {
        sent_datagrams: sent.0,
        sent_bytes: sent.1,
        send_secs,
        start,
        rx,
    }
}

fn run_std(a: &Args, nonce: u64) -> Run {
    let udp_len = datagram_len(a.payload);
    let (_, group) = lane0(nonce, free_port());
    let done = Arc::new(AtomicBool::new(false));
    let rx_socks: Vec<UdpSocket> = (0..RECEIVERS).map(|_| std_rx(group)).collect();
    let start = Instant::now();
    let workers: Vec<_> = rx_socks
        .into_iter()
        .map(|sock| {
            let done = done.clone();
            let batch = a.batch;
            thread::spawn(move || {
                receiver_sched(batch);
                sock.set_read_timeout(Some(Duration::from_millis(20)))
                    .expect("timeout");
                let mut buf = vec![0u8; 65536];
                let (mut bytes, mut datagrams, mut last) = (0u64, 0u64, start);
                let mut quiet_since = None::<Instant>;
                loop {
                    match sock.recv_from(&mut buf) {
                        Ok((n, _)) => {
                            bytes += n as u64;
                            datagrams += 1;
                            last = Instant::now();
                            quiet_since = None;
                        }
                        Err(_) if done.load(Ordering::Acquire) => {
                            let q = *quiet_since.get_or_insert_with(Instant::now);
                            if q.elapsed() > QUIET {
                                break;
                            }
                        }
                        Err(_) => {}
                    }
                }
                RxResult {
                    bytes,
                    datagrams,
                    last,
                    socket_drops: 0,
                }
            })
        })
        .collect();
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    socket2::SockRef::from(&tx)
        .set_multicast_if_v4(&Ipv4Addr::LOCALHOST)
        .expect("IP_MULTICAST_IF");
    tx.set_multicast_loop_v4(true).expect("loop");
    let data = vec![0xA5u8; udp_len];
    let mut p = pacer(a);
    let until = start + Duration::from_secs_f64(a.secs);
    let mut sent = 0u64;
    while Instant::now() < until {
        wait_paced(&mut p);
        // Same batch as the ringcast sender (64 KiB), one send_to per datagram.
        let batch = (65_507 / udp_len).clamp(1, 64);
        for _ in 0..batch {
            tx.send_to(&data, group).expect("send_to");
        }
        sent += batch as u64;
        charge(&mut p, batch * udp_len);
    }
    let send_secs = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Release);
    let rx = workers
        .into_iter()
        .map(|w| w.join().expect("receiver"))
        .collect();
    Run {
        sent_datagrams: sent,
        sent_bytes: sent * udp_len as u64,
        send_secs,
        start,
        rx,
    }
}

/// A plain multicast receiver: socket2 only for what std lacks before bind (`SO_REUSEPORT`,
/// `SO_RCVBUF`), the same buffer the ringcast receivers ask for.
fn std_rx(group: SocketAddrV4) -> UdpSocket {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).expect("socket");
    s.set_reuse_address(true).expect("reuseaddr");
    s.set_reuse_port(true).expect("reuseport");
    s.set_recv_buffer_size(SocketConfig::loopback().recv_buffer)
        .expect("rcvbuf");
    s.bind(&SocketAddr::V4(group).into()).expect("bind group");
    s.join_multicast_v4_n(
        group.ip(),
        &InterfaceIndexOrAddress::Address(Ipv4Addr::LOCALHOST),
    )
    .expect("join");
    s.into()
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("ephemeral port")
        .port()
}

/// The nonce both roles derive the group and Q_Key from.
const ROLE_NONCE: u64 = 0xB0_0004;

/// One role of a run across processes (`--role send|recv`).
fn run_role(a: &Args, role: &str) {
    let (job, group) = lane0(ROLE_NONCE, a.port);
    let net = SocketConfig::on_interface(a.iface);
    let udp_len = datagram_len(a.payload);
    match role {
        "recv" => {
            receiver_sched(a.batch);
            let sock = RxSocket::open(&net, group).expect("rx socket");
            let mut rx = LaneReceiver::new(sock, RxConfig::new(0, 0xFFFF, job.qkey(), a.payload));
            let mut sink = Sink::new(a.deliver, a.huge);
            println!("READY group={group}");
            let (mut first, mut last) = (None::<Instant>, Instant::now());
            let deadline = Instant::now() + Duration::from_secs_f64(a.secs + 10.0);
            loop {
                let n = deliver(&mut sink, rx.recv(Duration::from_millis(20)).expect("recv"));
                let now = Instant::now();
                if n > 0 {
                    first.get_or_insert(now);
                    last = now;
                } else if first.is_some_and(|_| now.duration_since(last) > QUIET) || now > deadline
                {
                    break;
                }
            }
            let s = *rx.stats();
            let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
            let bytes = s.accepted * udp_len as u64;
            println!(
                "GOODPUT gbps={:.3} bytes={bytes} datagrams={} secs={secs:.3} socket_drops={}",
                bytes as f64 * 8.0 / secs.max(1e-9) / 1e9,
                s.accepted,
                rx.socket().socket_drops().unwrap_or(0)
            );
        }
        "send" => {
            let mut tx = lane_sender(&net, &job, (0, group), a, true);
            let start = Instant::now();
            send_for(&mut tx, a, start, a.source);
            let s = *tx.stats();
            let secs = start.elapsed().as_secs_f64();
            println!(
                "SENT gbps={:.3} datagrams={} secs={secs:.3}",
                s.udp_bytes as f64 * 8.0 / secs / 1e9,
                s.datagrams
            );
        }
        other => {
            let _ = writeln!(std::io::stderr(), "goodput: unknown --role {other}");
        }
    }
}

fn main() {
    let a = args();
    if let Some(role) = &a.role {
        run_role(&a, role);
        return;
    }
    let udp_len = datagram_len(a.payload);
    let all = a.mode == "all";
    println!(
        "1 sender -> {RECEIVERS} receivers on loopback, payload {} B, {} s, {} lane(s), {}",
        a.payload,
        a.secs,
        a.lanes,
        if a.rate_mbps > 0.0 {
            format!("paced at {} MB/s", a.rate_mbps)
        } else {
            "unpaced".into()
        }
    );
    if all || a.mode == "gso" {
        report(
            "ringcast GSO+GRO",
            udp_len,
            &run_ringcast(&a, 0xB0_0001, true),
        );
    }
    if all || a.mode == "nogso" {
        report(
            "ringcast no GSO, GRO",
            udp_len,
            &run_ringcast(&a, 0xB0_0002, false),
        );
    }
    if all || a.mode == "std" {
        report("std UdpSocket", udp_len, &run_std(&a, 0xB0_0003));
    }
}
