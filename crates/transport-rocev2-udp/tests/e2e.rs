//! End to end: 4 ranks as threads, each a core `Node` driven by `pump` over the real transport
//! (RoCEv2 packets on loopback multicast, TCP control mesh and read service), with a real clock.
//!
//! Every test draws its own nonce (so its own groups and Q_Key) and ephemeral TCP and UDP
//! ports, so parallel runs never meet; every wait has a deadline, so a test fails, never hangs.

// Counters are printed for `--nocapture` runs and failed tests.
#![allow(clippy::print_stderr)]

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant as StdInstant};

use ringcast_core::port::{ControlPort, Faults, LaneRxPort, LaneTxPort, Ports, inject, mix, pump};
use ringcast_core::{Config, Event, Instant, Node, OpId, Rank};
use ringcast_transport_rocev2_udp::control::ControlStats;
use ringcast_transport_rocev2_udp::port::PortError;
use ringcast_transport_rocev2_udp::{
    ControlConfig, OpBuffer, Registry, TcpControl, UdpPort, UdpPortConfig, UdpRx,
};

const RANKS: u32 = 4;
const LANES: u16 = 2;
const BCAST_LEN: usize = (1 << 20) + 1000;
const BCAST_ROOT: u32 = 1;
const AG_BLOCK: usize = 256 << 10;
const LINK_BYTES_PER_SEC: u64 = 100_000_000;
const DEADLINE: Duration = Duration::from_secs(60);

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn nonce(salt: u64) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix(t ^ (u64::from(std::process::id()) << 32) ^ salt)
}

/// Byte `i` of rank `r`'s data for operation `salt`: changes with every 256-byte step, so a
/// chunk placed at the wrong offset is caught.
fn pattern(salt: u64, r: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (mix(salt ^ (u64::from(r) << 40) ^ (i as u64 >> 8)) as u8) ^ (i as u8))
        .collect()
}

struct RankReport {
    rank: u32,
    stats: ringcast_core::Stats,
    reads_served: u64,
    reads_refused: u64,
    reads_failed: u64,
    injected_losses: u64,
    /// Datagrams the lanes accepted, and the kernel dropped (full receive buffer).
    accepted: u64,
    kernel_drops: u64,
}

/// Pumps until every op of `ops` completed, or fails the test at `deadline` or at the first
/// failure.
fn run_until<R: LaneRxPort, T: LaneTxPort, C: ControlPort>(
    node: &mut Node,
    ports: &mut Ports<R, T, C>,
    clock: StdInstant,
    deadline: StdInstant,
    ops: &[OpId],
) -> Result<(), String> {
    let mut buf = Vec::new();
    let mut left: Vec<OpId> = ops.to_vec();
    let mut failed = None;
    while !left.is_empty() {
        if let Some((op, e)) = failed {
            return Err(format!("rank {}: {op} failed: {e:?}", node.config().rank.0));
        }
        if StdInstant::now() > deadline {
            return Err(format!(
                "rank {}: {left:?} not done by the deadline: {:?}",
                node.config().rank.0,
                node.stats()
            ));
        }
        let now = Instant::from_nanos(clock.elapsed().as_nanos() as u64);
        let p = pump(node, ports, now, 64, &mut buf, |e| match e {
            Event::Completed { op } => left.retain(|o| *o != op),
            Event::Failed { op, error } => failed = Some((op, error)),
            _ => {}
        });
        if p.is_idle() {
            thread::sleep(Duration::from_micros(50));
        }
    }
    Ok(())
}

/// Keeps answering peers until every rank is done (or the deadline).
fn linger<R: LaneRxPort, T: LaneTxPort, C: ControlPort>(
    node: &mut Node,
    ports: &mut Ports<R, T, C>,
    clock: StdInstant,
    deadline: StdInstant,
    done: &AtomicUsize,
) {
    let mut buf = Vec::new();
    while done.load(Ordering::Acquire) < RANKS as usize && StdInstant::now() < deadline {
        let now = Instant::from_nanos(clock.elapsed().as_nanos() as u64);
        if pump(node, ports, now, 64, &mut buf, |_| {}).is_idle() {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

/// One rank: a Broadcast of ~1 MiB from rank 1, then an Allgather of 256 KiB per rank, each
/// checked byte for byte.
#[allow(clippy::too_many_arguments)]
fn rank_main<R: LaneRxPort, T: LaneTxPort, C: ControlPort>(
    rank: u32,
    ports: &mut Ports<R, T, C>,
    registry: Registry,
    salt: u64,
    concurrent: bool,
    chunk: u32,
    done: &AtomicUsize,
) -> Result<ringcast_core::Stats, String> {
    let mut cfg = Config::new(rank, RANKS);
    cfg.lanes = LANES;
    cfg.chunk_size = chunk;
    cfg.peer_timeout = Duration::from_secs(10);
    // The cutoff timer (`N / B + alpha`) must leave the multicast time to arrive: loopback in
    // a debug build on a shared 2-core machine is far slower than the 100 Gbit/s default.
    cfg.link_bandwidth = LINK_BYTES_PER_SEC;
    cfg.cutoff_alpha = Duration::from_millis(20);
    let mut node = Node::new(cfg).map_err(|e| format!("config: {e:?}"))?;
    let clock = StdInstant::now();
    let deadline = clock + DEADLINE;
    let now = || Instant::from_nanos(clock.elapsed().as_nanos() as u64);

    // Broadcast.
    let expected = pattern(salt, BCAST_ROOT, BCAST_LEN);
    let buf = if rank == BCAST_ROOT {
        OpBuffer::from_vec(expected.clone())
    } else {
        OpBuffer::zeroed(BCAST_LEN)
    };
    let op = node
        .start_broadcast(now(), Rank(BCAST_ROOT), BCAST_LEN as u64)
        .map_err(|e| format!("start broadcast: {e:?}"))?;
    registry.register(op, buf.clone());
    if !concurrent {
        run_until(&mut node, ports, clock, deadline, &[op])?;
    }

    // Allgather.
    let blocks: Vec<Vec<u8>> = (0..RANKS)
        .map(|r| pattern(salt ^ 0xA6, r, AG_BLOCK))
        .collect();
    let mut mine = vec![0u8; AG_BLOCK * RANKS as usize];
    let at = rank as usize * AG_BLOCK;
    mine[at..at + AG_BLOCK].copy_from_slice(&blocks[rank as usize]);
    let ag = OpBuffer::from_vec(mine);
    let sizes = [AG_BLOCK as u64; RANKS as usize];
    let op2 = node
        .start_allgather(now(), &sizes)
        .map_err(|e| format!("start allgather: {e:?}"))?;
    registry.register(op2, ag.clone());
    let wait = if concurrent { vec![op, op2] } else { vec![op2] };
    run_until(&mut node, ports, clock, deadline, &wait)?;
    if buf.to_vec() != expected {
        return Err(format!("rank {rank}: broadcast bytes differ"));
    }
    if ag.to_vec() != blocks.concat() {
        return Err(format!("rank {rank}: allgather bytes differ"));
    }

    done.fetch_add(1, Ordering::AcqRel);
    linger(&mut node, ports, clock, deadline, done);
    registry.unregister(op);
    registry.unregister(op2);
    Ok(node.stats())
}

fn open(
    rank: u32,
    table: &[SocketAddr],
    listener: TcpListener,
    nonce: u64,
    udp_port: u16,
    chunk: u32,
) -> Result<UdpPort, String> {
    let control = TcpControl::connect(
        rank,
        table,
        listener,
        Registry::default(),
        ControlConfig::new(nonce),
    )
    .map_err(|e| format!("rank {rank}: control: {e}"))?;
    let cfg = UdpPortConfig {
        max_payload: chunk as usize,
        ..UdpPortConfig::loopback(rank, RANKS, LANES, nonce, udp_port)
    };
    UdpPort::open(&cfg, control).map_err(|e: PortError| format!("rank {rank}: data path: {e}"))
}

/// Rank `cfg.rank`'s data path opened with `cfg`, its control path alone in its table
/// (no peer to connect to), and the registry its operations' buffers go in.
fn lone_port(cfg: &UdpPortConfig) -> (UdpPort, Registry) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let table = vec![listener.local_addr().unwrap()];
    let control = TcpControl::connect(
        cfg.rank,
        &table,
        listener,
        Registry::default(),
        ControlConfig::new(cfg.nonce),
    )
    .unwrap();
    let registry = control.registry().clone();
    (UdpPort::open(cfg, control).unwrap(), registry)
}

fn lane_counts<'a>(rx: impl Iterator<Item = &'a UdpRx>) -> (u64, u64) {
    rx.fold((0, 0), |(a, d), r| {
        (
            a + r.receiver().stats().accepted,
            d + r.receiver().socket().socket_drops().unwrap_or(0),
        )
    })
}

fn snapshot(
    rank: u32,
    stats: ringcast_core::Stats,
    c: &ControlStats,
    injected: u64,
    (accepted, kernel_drops): (u64, u64),
) -> RankReport {
    RankReport {
        rank,
        stats,
        reads_served: c.reads_served.load(Ordering::Relaxed),
        reads_refused: c.reads_refused.load(Ordering::Relaxed),
        reads_failed: c.reads_failed.load(Ordering::Relaxed),
        injected_losses: injected,
        accepted,
        kernel_drops,
    }
}

/// Runs the 4 ranks; `lossy` names a rank that drops 10% of the chunks it receives and fails
/// to copy 2% of the rest; `concurrent` starts the Allgather before the Broadcast finished.
/// Chunks of 4 KiB, the default between hosts.
const CHUNK: u32 = 4096;
/// The ringcast crate's default on loopback: two datagrams to a GSO send.
const LOOPBACK_CHUNK: u32 = 32_640;

fn run_job(salt: u64, lossy: Option<u32>, concurrent: bool, chunk: u32) -> Vec<RankReport> {
    let nonce = nonce(salt);
    let udp_port = free_udp_port();
    let listeners: Vec<TcpListener> = (0..RANKS)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind control"))
        .collect();
    let table = UdpPort::table(&listeners).expect("table");
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let table = table.clone();
            let done = done.clone();
            let rank = r as u32;
            thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || -> Result<RankReport, String> {
                    let port = open(rank, &table, l, nonce, udp_port, chunk)?;
                    let ports = ringcast_core::port::Port::into_ports(port);
                    let registry = ports.control.registry().clone();
                    let result = if lossy == Some(rank) {
                        let faults = Faults {
                            rx_loss: 0.1,
                            // Copies that fail: the chunk is released and read instead.
                            rx_copy_fail: 0.02,
                            seed: nonce,
                            ..Faults::default()
                        };
                        let mut ports = inject(ports, faults);
                        let r =
                            rank_main(rank, &mut ports, registry, salt, concurrent, chunk, &done);
                        let injected = ports.rx.iter().map(|rx| rx.injected).sum();
                        // FaultyRx hides its inner half: no lane counters for this rank.
                        let lanes = (0, 0);
                        r.map(|s| snapshot(rank, s, ports.control.stats(), injected, lanes))
                    } else {
                        let mut ports = ports;
                        let r =
                            rank_main(rank, &mut ports, registry, salt, concurrent, chunk, &done);
                        let lanes = lane_counts(ports.rx.iter());
                        r.map(|s| snapshot(rank, s, ports.control.stats(), 0, lanes))
                    };
                    if result.is_err() {
                        // Let the others stop lingering.
                        done.fetch_add(1, Ordering::AcqRel);
                    }
                    result
                })
                .expect("spawn")
        })
        .collect();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(r)) => reports.push(r),
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a rank panicked".into()),
        }
    }
    for r in &reports {
        eprintln!(
            "rank {}: received {} fetched {} sent {} | reads served {} refused {} failed {} | injected {} | datagrams accepted {} kernel drops {}",
            r.rank,
            r.stats.chunks_received,
            r.stats.chunks_fetched,
            r.stats.chunks_sent,
            r.reads_served,
            r.reads_refused,
            r.reads_failed,
            r.injected_losses,
            r.accepted,
            r.kernel_drops
        );
    }
    assert!(errors.is_empty(), "{errors:#?}");
    // Every chunk a rank needs arrived exactly once: by multicast or by a read.
    let chunks = |len: usize| len.div_ceil(chunk as usize) as u64;
    for r in &reports {
        let mut want = (RANKS as u64 - 1) * chunks(AG_BLOCK);
        if r.rank != BCAST_ROOT {
            want += chunks(BCAST_LEN);
        }
        assert_eq!(
            r.stats.chunks_received + r.stats.chunks_fetched,
            want,
            "rank {}",
            r.rank
        );
    }
    reports
}

#[test]
fn broadcast_and_allgather_over_loopback_multicast() {
    let reports = run_job(1, None, false, CHUNK);
    assert_eq!(reports.len(), RANKS as usize);
}

/// The same with loopback's chunks: two datagrams of 32 668 bytes to a GSO send, and
/// received two to a GRO batch.
#[test]
fn broadcast_and_allgather_over_loopback_multicast_in_large_chunks() {
    let reports = run_job(5, None, false, LOOPBACK_CHUNK);
    assert_eq!(reports.len(), RANKS as usize);
}

#[test]
fn broadcast_and_allgather_in_flight_together() {
    let reports = run_job(4, None, true, CHUNK);
    assert_eq!(reports.len(), RANKS as usize);
}

#[test]
fn one_rank_losing_a_tenth_recovers_through_reads() {
    let reports = run_job(2, Some(2), false, CHUNK);
    let lossy = reports.iter().find(|r| r.rank == 2).expect("rank 2");
    assert!(lossy.injected_losses > 0, "no loss was injected");
    assert!(
        lossy.stats.chunks_fetched > 0,
        "the lossy rank fetched nothing"
    );
    assert!(
        lossy.stats.chunks_released > 0,
        "no failed copy was released"
    );
    let served: u64 = reports.iter().map(|r| r.reads_served).sum();
    assert!(served > 0, "no read was served over TCP");
}

#[test]
fn a_lost_rank_fails_the_survivors_and_is_named() {
    let nonce = nonce(3);
    let udp_port = free_udp_port();
    let listeners: Vec<TcpListener> = (0..RANKS)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind control"))
        .collect();
    let table = UdpPort::table(&listeners).expect("table");
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let table = table.clone();
            let rank = r as u32;
            thread::spawn(move || -> Result<Option<Rank>, String> {
                let port = open(rank, &table, l, nonce, udp_port, CHUNK)?;
                if rank == RANKS - 1 {
                    // Dies right after start-up: its connections close.
                    drop(port);
                    return Ok(None);
                }
                let mut ports = ringcast_core::port::Port::into_ports(port);
                let mut cfg = Config::new(rank, RANKS);
                cfg.lanes = LANES;
                cfg.peer_timeout = Duration::from_secs(2);
                let mut node = Node::new(cfg).map_err(|e| format!("config: {e:?}"))?;
                let clock = StdInstant::now();
                let len = 64 << 10;
                let buf = if rank == BCAST_ROOT {
                    OpBuffer::from_vec(pattern(3, rank, len))
                } else {
                    OpBuffer::zeroed(len)
                };
                let op = node
                    .start_broadcast(Instant::ZERO, Rank(BCAST_ROOT), len as u64)
                    .map_err(|e| format!("start: {e:?}"))?;
                ports.control.registry().register(op, buf);
                let r = run_until(
                    &mut node,
                    &mut ports,
                    clock,
                    clock + Duration::from_secs(30),
                    &[op],
                );
                match r {
                    Err(e) if e.contains("failed") => {}
                    other => return Err(format!("rank {rank}: expected a failure, got {other:?}")),
                }
                Ok(ports.control.lost_peers().first().copied())
            })
        })
        .collect();
    for (r, h) in handles.into_iter().enumerate() {
        let got = h.join().expect("rank panicked");
        if r as u32 == RANKS - 1 {
            continue;
        }
        assert_eq!(got, Ok(Some(Rank(RANKS - 1))), "rank {r}");
    }
}

/// The send half lays GSO batches out straight from the operation's buffer: every chunk in
/// range leaves with its bytes, one outside the buffer or of an unregistered operation is
/// counted lost and still reported done.
#[test]
fn send_half_sends_from_the_buffer_and_counts_what_it_cannot() {
    use ringcast_core::lane::Multicast;
    use ringcast_transport_rocev2_udp::{LaneReceiver, RxConfig, RxSocket, SocketConfig};

    let nonce = nonce(77);
    let cfg = UdpPortConfig::loopback(0, 1, 1, nonce, free_udp_port());
    let (port, registry) = lone_port(&cfg);
    let Ports { mut tx, .. } = ringcast_core::port::Port::into_ports(port);
    let mut tx = tx.remove(0);
    // A receiver of our own on the lane's group (loopback delivers to it).
    let job = ringcast_transport_rocev2_udp::addr::JobAddrs::derive(nonce, 1, &cfg.addr).unwrap();
    let mut rx = LaneReceiver::new(
        RxSocket::open(&SocketConfig::loopback(), job.group(0).unwrap()).unwrap(),
        RxConfig::new(0, 0xFFFF, job.qkey(), 4096),
    );
    let data = pattern(77, 0, 40 * 1000 + 10);
    let op = OpId(3);
    registry.register(op, OpBuffer::from_vec(data.clone()));
    let mc = |op: u64, k: u64, len: u32| Multicast {
        op: OpId(op),
        lane: 0,
        imm: k as u32,
        chunk: k as u32,
        offset: k * 1000,
        len,
    };
    // 40 chunks of 1000 bytes, the 20th out of the buffer, then one of an unknown op.
    for k in 0..40 {
        let len = if k == 20 { 2_000_000 } else { 1000 };
        tx.post_multicast(&mc(3, k, len));
    }
    tx.post_multicast(&mc(9, 0, 1000));
    let mut done = 0;
    let deadline = StdInstant::now() + DEADLINE;
    while tx.queued() > 0 && StdInstant::now() < deadline {
        tx.send_one_batch();
        while let Some((_, n)) = tx.take_done() {
            done += n;
        }
    }
    assert_eq!((done, tx.lost), (41, 2));
    assert_eq!(tx.sender().stats().datagrams, 39);
    // Every chunk that left carries its bytes.
    let mut got = std::collections::BTreeMap::new();
    while got.len() < 39 && StdInstant::now() < deadline {
        let b = rx.recv(Duration::from_millis(50)).unwrap();
        for c in b.iter() {
            got.insert(c.imm, c.payload.to_vec());
        }
    }
    assert_eq!(got.len(), 39);
    for (k, p) in got {
        let at = k as usize * 1000;
        assert_ne!(k, 20);
        assert_eq!(p, data[at..at + 1000], "chunk {k}");
    }
}

/// The receive half reads a predicted run straight into the operation's buffer: the tokens
/// have nothing to copy and the bytes are there, even behind an empty datagram (a rank's
/// own multicast comes back so, trimmed), which is taken alone rather than with a batched
/// read that would copy the chunks behind it. A later wait that finds nothing hands out
/// nothing (not the last batch again).
#[test]
fn receive_half_reads_a_predicted_run_in_place_once() {
    use ringcast_core::Placement;
    use ringcast_core::lane::Run;
    use ringcast_core::port::RxToken;
    use ringcast_transport_rocev2_udp::{LaneSender, OutChunk, SocketConfig, TxConfig, TxSocket};

    let nonce = nonce(78);
    let mut cfg = UdpPortConfig::loopback(0, 2, 1, nonce, free_udp_port());
    cfg.verify_icrc = false;
    let (port, registry) = lone_port(&cfg);
    let Ports { mut rx, .. } = ringcast_core::port::Port::into_ports(port);
    let mut rx = rx.remove(0);
    let job = ringcast_transport_rocev2_udp::addr::JobAddrs::derive(nonce, 1, &cfg.addr).unwrap();
    // Rank 1's sender on the lane's group.
    let mut tx = LaneSender::new(
        TxSocket::open(&SocketConfig::loopback()).unwrap(),
        TxConfig {
            lane: 0,
            group: job.group(0).unwrap(),
            pkey: 0xFFFF,
            qkey: job.qkey(),
            rank: 1,
            max_payload: 4096,
            gso: true,
            initial_psn: 0,
        },
    )
    .unwrap();
    let data = pattern(78, 1, 15 * 4096);
    let op = OpId(5);
    let buf = OpBuffer::zeroed(data.len());
    registry.register(op, buf.clone());
    let chunks: Vec<OutChunk<'_>> = data
        .chunks(4096)
        .enumerate()
        .map(|(k, p)| OutChunk {
            imm: k as u32,
            payload: p,
        })
        .collect();
    // An empty datagram on the group first.
    let empty = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
    empty
        .set_multicast_if_v4(&std::net::Ipv4Addr::LOCALHOST)
        .unwrap();
    empty.set_multicast_loop_v4(true).unwrap();
    let group = job.group(0).unwrap();
    assert_eq!(empty.send_to(&[], &group.into()).unwrap(), 0);
    assert_eq!(tx.send_batch(&chunks).unwrap().chunks, 15);

    let predict = |from: Rank, imm: u32, max: u32| {
        assert_eq!(from, Rank(1));
        Some(Run {
            op,
            offset: u64::from(imm) * 4096,
            chunks: (15 - imm).min(max),
            chunk_len: 4096,
            last_len: 4096,
        })
    };
    let deadline = StdInstant::now() + DEADLINE;
    let mut placed = 0;
    while placed < 15 && StdInstant::now() < deadline {
        rx.wait_with(Duration::from_millis(50), predict);
        // As a receive worker does: exactly the batch held, no read past it.
        while rx.held() > 0 {
            let t = rx.receive().unwrap();
            let m = t.meta();
            assert!(t.consume(&Placement::Place {
                op,
                offset: u64::from(m.imm) * 4096,
                len: 4096,
            }));
            placed += 1;
        }
    }
    assert_eq!(placed, 15);
    assert_eq!(rx.receiver().stats().direct, 15);
    assert_eq!(rx.receiver().stats().empty, 1);
    assert_eq!((rx.bad_place, rx.moved), (0, 0));
    assert!(buf.to_vec() == data, "the buffer holds what was sent");
    // Nothing more is queued: a wait hands out nothing.
    assert_eq!(rx.wait_with(Duration::from_millis(20), predict), 0);
}

/// On loopback a rank's port sends from an address of its own (127.77.0.1 on, by rank) and
/// its receive half blocks it: the rank's own multicast never reaches its receive half, not
/// even as empty datagrams, while another member of the group takes every chunk.
#[test]
fn a_ports_own_multicast_never_reaches_its_receive_half_on_loopback() {
    use ringcast_core::lane::Multicast;
    use ringcast_transport_rocev2_udp::{LaneReceiver, RxConfig, RxSocket, SocketConfig};

    let nonce = nonce(79);
    let cfg = UdpPortConfig::loopback(0, 2, 1, nonce, free_udp_port());
    let (port, registry) = lone_port(&cfg);
    let Ports { mut tx, mut rx, .. } = ringcast_core::port::Port::into_ports(port);
    let (mut tx, mut own) = (tx.remove(0), rx.remove(0));
    assert_eq!(
        tx.sender().socket().local_addr().ip().octets(),
        [127, 77, 0, 1],
        "rank 0's own address"
    );
    let job = ringcast_transport_rocev2_udp::addr::JobAddrs::derive(nonce, 1, &cfg.addr).unwrap();
    let mut peer = LaneReceiver::new(
        RxSocket::open(&SocketConfig::loopback(), job.group(0).unwrap()).unwrap(),
        RxConfig::new(0, 0xFFFF, job.qkey(), 4096),
    );
    let data = pattern(79, 0, 20 * 4096);
    let op = OpId(4);
    registry.register(op, OpBuffer::from_vec(data.clone()));
    for k in 0..20u32 {
        tx.post_multicast(&Multicast {
            op,
            lane: 0,
            imm: k,
            chunk: k,
            offset: u64::from(k) * 4096,
            len: 4096,
        });
    }
    let deadline = StdInstant::now() + DEADLINE;
    while tx.queued() > 0 && StdInstant::now() < deadline {
        tx.send_one_batch();
    }
    let mut got = 0;
    while got < 20 && StdInstant::now() < deadline {
        let b = peer.recv(Duration::from_millis(50)).unwrap();
        for c in b.iter() {
            let at = c.imm as usize * 4096;
            assert_eq!((c.rank, c.payload), (0, &data[at..at + 4096]));
            got += 1;
        }
    }
    assert_eq!(got, 20, "the peer takes every chunk");
    // Everything the rank sent reached the peer; none of it is queued at its own half.
    assert_eq!(own.wait(Duration::from_millis(100)), 0);
    let s = own.receiver().stats();
    assert_eq!((s.datagrams, s.empty, s.recv_calls), (0, 0, 0));
    assert_eq!(own.receiver().socket().socket_drops().unwrap(), 0);
}

/// A payload limit no datagram can carry (`usize::MAX` as "no limit" wrapped the datagram
/// length, and the first send panicked) is refused when the port opens.
#[test]
fn a_payload_limit_no_datagram_can_carry_is_refused() {
    for max_payload in [
        ringcast_transport_rocev2_udp::MAX_CHUNK_PAYLOAD + 1,
        usize::MAX,
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let table = vec![listener.local_addr().unwrap()];
        let control = TcpControl::connect(
            0,
            &table,
            listener,
            Registry::default(),
            ControlConfig::new(9),
        )
        .unwrap();
        let cfg = UdpPortConfig {
            max_payload,
            ..UdpPortConfig::loopback(0, 1, 1, 9, free_udp_port())
        };
        assert!(
            matches!(UdpPort::open(&cfg, control), Err(PortError::Tx(_))),
            "{max_payload}"
        );
    }
}
