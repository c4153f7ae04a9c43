//! The data path over real kernel multicast on loopback, without root.
//!
//! Every test uses its own nonce (so its own groups) and an ephemeral port, so tests running
//! in parallel never see each other's packets; every receive loop has a deadline.

// Counters are printed for `--nocapture` runs and failed tests.
#![allow(clippy::print_stderr)]

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use ringcast_transport_rocev2_udp::addr::{AddrConfig, JobAddrs};
use ringcast_transport_rocev2_udp::icrc::FlowIcrc;
use ringcast_transport_rocev2_udp::port::loopback_source;
use ringcast_transport_rocev2_udp::{
    LaneReceiver, LaneSender, OutChunk, RxConfig, RxSocket, RxStats, SocketConfig, SocketError,
    TxConfig, TxSocket,
};

const PKEY: u16 = 0xFFFF;
const MAX_PAYLOAD: usize = 4096;
const DEADLINE: Duration = Duration::from_secs(20);

/// An unused UDP port (bound and released; the group address keeps tests apart anyway).
fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn job(nonce: u64, port: u16) -> (JobAddrs, SocketAddrV4) {
    let cfg = AddrConfig {
        port,
        ..AddrConfig::default()
    };
    let job = JobAddrs::derive(nonce, 1, &cfg).unwrap();
    let group = job.group(0).unwrap();
    (job, group)
}

fn sender(job: &JobAddrs, group: SocketAddrV4, rank: u32, gso: bool) -> LaneSender {
    lane_sender(
        TxSocket::open(&SocketConfig::loopback()).unwrap(),
        job,
        group,
        rank,
        gso,
    )
}

fn lane_sender(
    sock: TxSocket,
    job: &JobAddrs,
    group: SocketAddrV4,
    rank: u32,
    gso: bool,
) -> LaneSender {
    LaneSender::new(
        sock,
        TxConfig {
            lane: 0,
            group,
            pkey: PKEY,
            qkey: job.qkey(),
            rank,
            max_payload: MAX_PAYLOAD,
            gso,
            initial_psn: 0xFF_FFF0, // wraps during the test
        },
    )
    .unwrap()
}

fn receiver(job: &JobAddrs, group: SocketAddrV4, cfg: impl FnOnce(&mut RxConfig)) -> LaneReceiver {
    let sock = RxSocket::open(&SocketConfig::loopback(), group).unwrap();
    assert!(sock.granted_recv_buffer() > 0);
    assert_eq!(sock.socket_drops().unwrap(), 0);
    let mut rx = RxConfig::new(0, PKEY, job.qkey(), MAX_PAYLOAD);
    cfg(&mut rx);
    LaneReceiver::new(sock, rx)
}

/// Chunk `k`'s payload: full chunks, a few odd lengths (pad), and a short last chunk.
fn payload(k: usize, n: usize) -> Vec<u8> {
    let len = match k {
        _ if k == n - 1 => 1_001,
        7 => 3,
        8 => 0,
        _ => MAX_PAYLOAD,
    };
    (0..len).map(|i| (k * 31 + i * 7) as u8).collect()
}

/// A chunk per payload, numbered from 0 by its immediate.
fn numbered(data: &[Vec<u8>]) -> Vec<OutChunk<'_>> {
    data.iter()
        .enumerate()
        .map(|(k, p)| OutChunk {
            imm: k as u32,
            payload: p,
        })
        .collect()
}

/// One sender, three receivers in threads; the sender sends windows and waits for every
/// receiver to hold the window (resending it after a pause, should the kernel drop some), so
/// the test holds with the default 208 KiB receive buffers. Every byte is checked.
///
/// `in_place`: the batches go through `send_in_place` (gathered from the payloads where they
/// lie, with GSO), else through `send_batch` (laid out in the staging buffer).
fn one_to_three(nonce: u64, gso: bool, in_place: bool) {
    const N: usize = 600;
    const WINDOW: usize = 12;
    let (job, group) = job(nonce, free_port());
    let mut tx = sender(&job, group, 5, gso);
    assert!(tx.sends_in_place(), "on by default");
    let src = tx.socket().local_addr();
    let rxs: Vec<LaneReceiver> = (0..3)
        .map(|i| {
            receiver(&job, group, |c| {
                // Receiver 0 checks ICRCs, receiver 1 knows its sender; all must accept all.
                c.verify_icrc = i == 0;
                if i == 1 {
                    c.sources = vec![(src, 5)];
                }
            })
        })
        .collect();
    let payloads: Vec<Vec<u8>> = (0..N).map(|k| payload(k, N)).collect();
    let payloads = Arc::new(payloads);
    let held: Arc<Vec<AtomicUsize>> = Arc::new((0..3).map(|_| AtomicUsize::new(0)).collect());
    let start = Instant::now();

    let workers: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(i, mut rx)| {
            let (payloads, held) = (payloads.clone(), held.clone());
            thread::spawn(move || {
                let mut seen = vec![false; N];
                let mut distinct = 0;
                while distinct < N && start.elapsed() < DEADLINE {
                    let batch = rx.recv(Duration::from_millis(20)).unwrap();
                    for c in batch.iter() {
                        assert_eq!((c.source, c.rank, c.lane), (src, 5, 0));
                        let k = c.imm as usize;
                        assert_eq!(c.payload, &payloads[k][..], "receiver {i} chunk {k}");
                        // PSN k from 0xFFFFF0 on (resends get later PSNs).
                        if !seen[k] {
                            seen[k] = true;
                            distinct += 1;
                        }
                    }
                    // Chunks arrive in order within a window; publish the contiguous prefix.
                    let prefix = seen.iter().take_while(|s| **s).count();
                    held[i].store(prefix, Ordering::Release);
                }
                (distinct, *rx.stats(), rx.socket().socket_drops().unwrap())
            })
        })
        .collect();

    let mut resends = 0;
    let mut k = 0;
    while k < N && start.elapsed() < DEADLINE {
        let end = (k + WINDOW).min(N);
        let chunks: Vec<OutChunk<'_>> = (k..end)
            .map(|j| OutChunk {
                imm: j as u32,
                payload: &payloads[j],
            })
            .collect();
        let mut at = 0;
        while at < chunks.len() {
            let sent = if in_place {
                tx.send_in_place(&chunks[at..])
            } else {
                tx.send_batch(&chunks[at..])
            };
            at += sent.unwrap().chunks;
        }
        let sent_at = Instant::now();
        while held.iter().any(|h| h.load(Ordering::Acquire) < end) {
            if sent_at.elapsed() > Duration::from_millis(300) {
                resends += 1;
                break;
            }
            thread::sleep(Duration::from_micros(200));
        }
        if held.iter().all(|h| h.load(Ordering::Acquire) >= end) {
            k = end;
        }
    }
    let results: Vec<(usize, RxStats, u64)> =
        workers.into_iter().map(|w| w.join().unwrap()).collect();
    let tx_stats = *tx.stats();
    eprintln!("gso={gso} in_place={in_place} tx={tx_stats:?} resends={resends}");
    for (i, (distinct, stats, drops)) in results.iter().enumerate() {
        eprintln!("receiver {i}: {stats:?} socket drops {drops}");
        assert_eq!(*distinct, N, "receiver {i} got every chunk");
        assert_eq!(stats.dropped(), 0, "receiver {i}: {stats:?}");
        assert_eq!(stats.accepted, stats.datagrams);
    }
    // PSNs wrapped from 0xFFFFF0 through 0.
    assert_eq!(
        tx.next_psn(),
        (0xFF_FFF0 + tx_stats.datagrams as u32) & 0xFF_FFFF
    );
    if gso && tx.gso_active() {
        assert!(
            tx_stats.sends < tx_stats.datagrams,
            "GSO batches: {tx_stats:?}"
        );
    } else {
        assert_eq!(tx_stats.sends, tx_stats.datagrams);
    }
    // In place means gathered with GSO; every datagram went that way, or none did.
    if in_place && tx.gso_active() {
        assert_eq!(tx_stats.in_place, tx_stats.datagrams, "{tx_stats:?}");
    } else {
        assert_eq!(tx_stats.in_place, 0, "{tx_stats:?}");
    }
}

#[test]
fn one_sender_three_receivers_gso() {
    one_to_three(0x5EED_0001, true, false);
}

#[test]
fn one_sender_three_receivers_gso_sent_in_place() {
    one_to_three(0x5EED_0003, true, true);
}

#[test]
fn one_sender_three_receivers_without_gso() {
    one_to_three(0x5EED_0002, false, false);
}

#[test]
fn without_gso_sending_in_place_lays_batches_out() {
    one_to_three(0x5EED_0004, false, true);
}

/// A hand-written packet (not built by the crate): BTH, DETH, ImmDt, payload, ICRC.
struct Raw {
    opcode: u8,
    pkey: u16,
    dest_qp: u32,
    qkey: u32,
    src_qp: u32,
    payload_len: usize,
}

impl Raw {
    fn bytes(&self, flow: &FlowIcrc) -> Vec<u8> {
        let mut p = vec![self.opcode, 0];
        p.extend(self.pkey.to_be_bytes());
        p.extend(self.dest_qp.to_be_bytes()); // byte 4 reserved = 0, then 24 bits
        p.extend(9u32.to_be_bytes()); // PSN 9
        p.extend(self.qkey.to_be_bytes());
        p.extend(self.src_qp.to_be_bytes());
        p.extend(0xABCD_0001u32.to_be_bytes());
        p.extend((0..self.payload_len).map(|i| i as u8));
        p.extend([0u8; 4]);
        let icrc = flow.compute(0, &p).unwrap();
        let n = p.len();
        p[n - 4..].copy_from_slice(&icrc.to_le_bytes());
        p
    }
}

#[test]
fn hostile_sender_is_counted_and_ignored() {
    let (job, group) = job(0x5EED_0003, free_port());
    let mut tx = sender(&job, group, 2, true);
    let src = tx.socket().local_addr();
    let mut checking = receiver(&job, group, |c| c.verify_icrc = true);
    let mut known = receiver(&job, group, |c| c.sources = vec![(src, 2)]);

    let hostile = UdpSocket::bind("127.0.0.1:0").unwrap();
    hostile.set_multicast_loop_v4(true).unwrap();
    let SocketAddr::V4(hostile_addr) = hostile.local_addr().unwrap() else {
        unreachable!()
    };
    let flow = FlowIcrc::new(hostile_addr, group);
    let good = Raw {
        opcode: 0x65,
        pkey: PKEY,
        dest_qp: 0xFF_FFFF,
        qkey: job.qkey(),
        src_qp: 2,
        payload_len: 64,
    };
    let mut bad_icrc = good.bytes(&flow);
    let last = bad_icrc.len() - 1;
    bad_icrc[last] ^= 0x80;
    let packets = [
        good.bytes(&flow),
        Raw {
            qkey: job.qkey() ^ 1,
            ..good
        }
        .bytes(&flow),
        Raw {
            pkey: 0x7FFF,
            ..good
        }
        .bytes(&flow),
        Raw {
            opcode: 0x64,
            ..good
        }
        .bytes(&flow),
        good.bytes(&flow)[..27].to_vec(),
        Raw {
            payload_len: MAX_PAYLOAD + 4,
            ..good
        }
        .bytes(&flow),
        Raw {
            dest_qp: 0x00_0001,
            ..good
        }
        .bytes(&flow),
        bad_icrc,
    ];
    // Multicast from a plain socket needs the loopback interface chosen.
    socket2::SockRef::from(&hostile)
        .set_multicast_if_v4(&Ipv4Addr::LOCALHOST)
        .unwrap();
    let payloads: Vec<Vec<u8>> = (0..16).map(|k| vec![k as u8; 100 + k]).collect();
    for (k, p) in packets.iter().enumerate() {
        hostile.send_to(p, group).unwrap();
        let c = [OutChunk {
            imm: k as u32,
            payload: &payloads[k],
        }];
        tx.send_batch(&c).unwrap();
    }
    let rest: Vec<OutChunk<'_>> = (8..16)
        .map(|k| OutChunk {
            imm: k as u32,
            payload: &payloads[k],
        })
        .collect();
    let mut at = 0;
    while at < rest.len() {
        at += tx.send_batch(&rest[at..]).unwrap().chunks;
    }

    let total = (packets.len() + payloads.len()) as u64;
    for (name, rx) in [("checking", &mut checking), ("known", &mut known)] {
        let start = Instant::now();
        let mut got = Vec::new();
        while rx.stats().datagrams < total && start.elapsed() < DEADLINE {
            for c in rx.recv(Duration::from_millis(20)).unwrap().iter() {
                got.push((c.source, c.rank, c.imm, c.payload.to_vec()));
            }
        }
        let s = *rx.stats();
        eprintln!("{name}: {s:?}");
        assert_eq!(s.datagrams, total, "{name}");
        assert_eq!(
            (s.truncated, s.oversize, s.opcode, s.pkey, s.qkey, s.destqp),
            (1, 1, 1, 1, 1, 1),
            "{name}"
        );
        let legit: Vec<_> = got.iter().filter(|g| g.0 == src).collect();
        assert_eq!(legit.len(), 16, "{name}");
        for (source, rank, imm, payload) in legit {
            assert_eq!((*source, *rank), (src, 2));
            assert_eq!(payload, &payloads[*imm as usize]);
        }
        let stray: Vec<_> = got.iter().filter(|g| g.0 != src).collect();
        if name == "checking" {
            // Accepts the one valid hostile packet (any source), refuses the bad ICRC.
            assert_eq!((s.bad_icrc, s.unknown_source), (1, 0));
            assert_eq!(stray.len(), 1);
            assert_eq!(stray[0].0, hostile_addr);
            assert_eq!(stray[0].2, 0xABCD_0001);
            assert_eq!(stray[0].3, (0..64).map(|i| i as u8).collect::<Vec<_>>());
        } else {
            // Knows only the legit sender: the valid and the bad-ICRC packet are strangers.
            assert_eq!((s.bad_icrc, s.unknown_source), (0, 2));
            assert!(stray.is_empty());
        }
        assert_eq!(s.accepted + s.dropped(), s.datagrams);
    }
}

#[test]
fn port_in_use_is_reported_clearly() {
    let plain = UdpSocket::bind("0.0.0.0:0").unwrap();
    let port = plain.local_addr().unwrap().port();
    let (_, group) = job(0x5EED_0004, port);
    match RxSocket::open(&SocketConfig::loopback(), group) {
        Err(e @ SocketError::PortInUse { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&port.to_string()), "{msg}");
            assert!(msg.contains("SO_REUSEPORT"), "{msg}");
            assert!(msg.contains("AddrConfig::port"), "{msg}");
            let SocketError::PortInUse { port: p, addr } = e else {
                unreachable!()
            };
            assert_eq!((p, addr), (port, group));
        }
        other => panic!("expected PortInUse, got {other:?}"),
    }
}

#[test]
fn two_jobs_on_one_port_do_not_mix() {
    let port = free_port();
    let (job_a, group_a) = job(0x5EED_0005, port);
    let (job_b, group_b) = job(0x5EED_0006, port);
    assert_ne!(group_a, group_b);
    assert_ne!(job_a.qkey(), job_b.qkey());
    let mut tx_a = sender(&job_a, group_a, 0, true);
    let mut rx_a = receiver(&job_a, group_a, |_| {});
    let mut rx_b = receiver(&job_b, group_b, |_| {});
    let data = vec![0x5A; 2048];
    let chunks: Vec<OutChunk<'_>> = (0..8)
        .map(|k| OutChunk {
            imm: k,
            payload: &data,
        })
        .collect();
    assert_eq!(tx_a.send_batch(&chunks).unwrap().chunks, 8);
    let start = Instant::now();
    while rx_a.stats().accepted < 8 && start.elapsed() < DEADLINE {
        rx_a.recv(Duration::from_millis(20)).unwrap();
    }
    assert_eq!(rx_a.stats().accepted, 8);
    // B's socket is bound to B's group with IP_MULTICAST_ALL off: nothing arrives at all.
    let batch = rx_b.recv(Duration::from_millis(200)).unwrap();
    assert!(batch.is_empty());
    assert_eq!(rx_b.stats().datagrams, 0);
}

#[test]
fn oversized_chunk_is_refused_before_sending() {
    let (job, group) = job(0x5EED_0007, free_port());
    let mut tx = sender(&job, group, 0, true);
    let big = vec![0u8; MAX_PAYLOAD + 1];
    let small = vec![0u8; 10];
    assert!(
        tx.send_batch(&[OutChunk {
            imm: 0,
            payload: &big
        }])
        .is_err()
    );
    // A batch stops before an oversized chunk and after a short one.
    let chunks = [
        OutChunk {
            imm: 0,
            payload: &small,
        },
        OutChunk {
            imm: 1,
            payload: &big,
        },
    ];
    assert_eq!(tx.send_batch(&chunks).unwrap().chunks, 1);
    assert_eq!(tx.stats().datagrams, 1);
}

/// A receive worker parked in `recv` with a long timeout returns as soon as another thread
/// wakes it (the engine's control thread does after queuing it a command), and still reads
/// datagrams that arrive after a wake.
#[test]
fn a_waker_ends_a_long_wait_and_reception_goes_on() {
    let (job, group) = job(0x3A4E_0001, free_port());
    let mut rx = receiver(&job, group, |_| {});
    let waker = rx.waker();
    let (done, finished) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        let n = rx.recv(Duration::from_secs(3600)).expect("recv").len();
        done.send(n).expect("report");
        // After the wake, a datagram sent later still ends a wait.
        let mut got = 0;
        for _ in 0..200 {
            got += rx.recv(Duration::from_millis(50)).expect("recv").len();
            if got > 0 {
                break;
            }
        }
        got
    });
    // Woken while (or before) it waits: either way the wait ends.
    thread::sleep(Duration::from_millis(50));
    waker.wake();
    let n = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the woken receiver returned");
    assert_eq!(n, 0, "nothing was sent yet");
    let mut tx = sender(&job, group, 1, false);
    let data = payload(0, 1024);
    tx.send_batch(&[OutChunk {
        imm: 0,
        payload: &data,
    }])
    .expect("send");
    assert_eq!(t.join().expect("receiver thread"), 1);
}

/// `own` sends a GSO batch of 8 chunks (chunk 7, short, ends it) and a single datagram,
/// `other` its chunk 7, `own` one more: 10 own chunks in 3 sends, and another's between.
/// Returns the payloads, by chunk.
fn own_then_other(own: &mut LaneSender, other: &mut LaneSender) -> Vec<Vec<u8>> {
    let data: Vec<Vec<u8>> = (0..8).map(|k| payload(k, 100)).collect();
    let chunks = numbered(&data);
    assert_eq!(own.send_batch(&chunks).unwrap().chunks, 8);
    assert_eq!(own.send_batch(&chunks[7..]).unwrap().chunks, 1);
    assert_eq!(other.send_batch(&chunks[7..]).unwrap().chunks, 1);
    assert_eq!(own.send_batch(&chunks[..1]).unwrap().chunks, 1);
    data
}

/// A receive socket told to ignore its rank's own send socket reads that socket's datagrams
/// (GSO batches and single ones) as empty, never as chunks, and still takes every datagram of
/// another sender on the same group; none of it counts as a kernel drop.
#[test]
fn own_multicast_is_filtered_and_others_pass() {
    let (job, group) = job(0x0F11_7E20, free_port());
    let mut own = sender(&job, group, 0, true);
    let mut other = sender(&job, group, 1, true);
    let mut rx = receiver(&job, group, |_| {});
    rx.socket()
        .ignore_source(own.socket().local_addr())
        .expect("filter attached");
    let data = own_then_other(&mut own, &mut other);
    let mut got = Vec::new();
    let start = Instant::now();
    while rx.stats().empty < 3 && start.elapsed() < DEADLINE {
        let batch = rx.recv(Duration::from_millis(20)).unwrap();
        got.extend(batch.iter().map(|c| (c.rank, c.imm, c.payload.to_vec())));
    }
    let s: RxStats = *rx.stats();
    eprintln!("{s:?}");
    assert_eq!(
        got,
        vec![(1, 7, data[7].clone())],
        "only the other sender's chunk"
    );
    assert_eq!(s.empty, 3, "one empty datagram per own send");
    assert_eq!((s.datagrams, s.accepted, s.dropped()), (1, 1, 0));
    assert_eq!(rx.socket().socket_drops().unwrap(), 0);
}

/// On loopback a rank's send socket has an address of its own, and its receive socket blocks
/// that address: the rank's own datagrams (GSO batches and single ones) never reach the
/// socket, not even as empty ones, while another sender's do; a second receive socket on the
/// same group, which blocks nothing, still takes every datagram of both. Nothing counts as a
/// kernel drop.
#[test]
fn own_multicast_is_blocked_by_its_source_address() {
    let (job, group) = job(0x0F11_7E21, free_port());
    let cfg = SocketConfig::loopback();
    let (own_at, other_at) = (
        loopback_source(cfg.interface, 0).expect("an address for rank 0"),
        loopback_source(cfg.interface, 1).expect("an address for rank 1"),
    );
    assert_ne!(own_at, other_at);
    let open = |at| TxSocket::open_from(&cfg, at).expect("send socket on its own address");
    let mut own = lane_sender(open(own_at), &job, group, 0, true);
    let mut other = lane_sender(open(other_at), &job, group, 1, true);
    assert_eq!(*own.socket().local_addr().ip(), own_at);
    let mut rx = receiver(&job, group, |_| {});
    let mut peer = receiver(&job, group, |_| {});
    rx.socket()
        .block_source(cfg.interface, own_at)
        .expect("source blocked");
    let data = own_then_other(&mut own, &mut other);
    // The peer takes all 11 chunks; the other sender's chunk was sent after all but the last
    // own datagram, so once the peer has every chunk, the blocking socket has had its chance
    // at every own datagram that came before the other's (one queue, in order on loopback).
    let mut at_peer = 0;
    let start = Instant::now();
    while at_peer < 11 && start.elapsed() < DEADLINE {
        at_peer += peer.recv(Duration::from_millis(20)).unwrap().len();
    }
    assert_eq!(at_peer, 11, "the peer blocks nothing");
    let mut got = Vec::new();
    let start = Instant::now();
    while got.is_empty() && start.elapsed() < DEADLINE {
        let batch = rx.recv(Duration::from_millis(20)).unwrap();
        got.extend(
            batch
                .iter()
                .map(|c| (c.rank, c.imm, c.payload == data[7].as_slice())),
        );
    }
    // And the own datagram sent last is not queued behind it.
    let after = rx.recv(Duration::from_millis(100)).unwrap().len();
    let s: RxStats = *rx.stats();
    eprintln!("{s:?}");
    assert_eq!(got, vec![(1, 7, true)], "only the other sender's chunk");
    assert_eq!(after, 0);
    assert_eq!(s.empty, 0, "no own datagram reached the socket");
    assert_eq!((s.datagrams, s.accepted, s.dropped()), (1, 1, 0));
    assert_eq!(rx.socket().socket_drops().unwrap(), 0);
    assert_eq!(peer.socket().socket_drops().unwrap(), 0);
}
