//! The Communicator end to end: 4 ranks as threads in one process on loopback multicast
//! (builder with an explicit peer table), then 4 ranks as processes bootstrapping from
//! `RINGCAST_*` variables (this test binary re-executed in a child role).
//!
//! Every test draws its own nonce, TCP and UDP ports, so parallel runs never meet; every wait
//! has a deadline, so a test fails, never hangs.
#![cfg(feature = "rocev2-udp")]
// Children report to the parent on stdout; failures explain themselves on stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use ringcast::comm::CommBuilder;
use ringcast::{BuildError, CommError, Communicator};

mod common;

use common::{
    broadcast_buffer, broadcast_checked, check, e, free_tcp_port, free_udp_port, ibroadcast_of,
    nonce, pattern, random_ops, soak_ops, thread_world,
};

const RANKS: u32 = 4;
const DEADLINE: Duration = Duration::from_secs(90);

/// Runs `f` on `RANKS` communicators, each on its own thread; fails at the deadline. Every
/// operation runs over multicast, small ones too (what these tests check).
fn world<R: Send + 'static>(
    salt: u64,
    f: impl Fn(Communicator) -> Result<R, String> + Send + Sync + Clone + 'static,
) -> Vec<R> {
    world_with(salt, |b| b.tcp_threshold(0), f)
}

/// [`world`], with `tweak` applied to every rank's builder last (the TCP threshold, the ICRC
/// check, the peer timeout).
fn world_with<R: Send + 'static>(
    salt: u64,
    tweak: impl Fn(CommBuilder) -> CommBuilder + Send + Sync + Clone + 'static,
    f: impl Fn(Communicator) -> Result<R, String> + Send + Sync + Clone + 'static,
) -> Vec<R> {
    thread_world(
        RANKS,
        salt,
        DEADLINE,
        // The start-up check ends once every rank is heard: the default 2 s only bounds a
        // failure, and a rank starved that long on a loaded machine failed the check.
        move |_, b, _| tweak(b.startup_check(Duration::from_secs(6))),
        move |_, comm| f(comm.map_err(|e| format!("build: {e}"))?),
    )
}

/// On loopback the chunks are `LOOPBACK_CHUNK` bytes by default.
#[test]
fn broadcast_allgather_allgatherv_byte_for_byte() {
    world(1, |comm| {
        if comm.chunk_size() != ringcast::comm::LOOPBACK_CHUNK {
            return Err(format!("chunks of {} B on loopback", comm.chunk_size()));
        }
        byte_for_byte(&comm)
    });
}

/// The same in 4 KiB chunks, the default between hosts.
#[test]
fn broadcast_allgather_allgatherv_byte_for_byte_in_4_kib_chunks() {
    world_with(
        7,
        |b| b.tcp_threshold(0).chunk_size(4096),
        |comm| {
            if comm.chunk_size() != 4096 {
                return Err(format!("chunks of {} B, not 4096", comm.chunk_size()));
            }
            byte_for_byte(&comm)
        },
    );
}

fn byte_for_byte(comm: &Communicator) -> Result<(), String> {
    let me = comm.rank();
    // Broadcast, ~1 MiB from rank 1.
    let st = broadcast_checked(comm, "broadcast", 1, 1, (1 << 20) + 1000)?;
    if me != 1 && st.counters.chunks_received + st.counters.chunks_fetched == 0 {
        return Err(format!("no chunk counted: {st:?}"));
    }
    // The receivers' kernels wrote chunks where they belong (read in place), and none
    // had to be moved afterwards.
    let s = comm.stats().map_err(e)?;
    if s.rx_moved != 0 || (me != 1 && s.rx.direct == 0) {
        return Err(format!(
            "received in place: moved {}, {:?}",
            s.rx_moved, s.rx
        ));
    }
    // Allgather, 64 KiB per rank.
    let block = 64 << 10;
    let blocks: Vec<Vec<u8>> = (0..RANKS).map(|r| pattern(2, r, block)).collect();
    let mut recv = vec![0u8; block * RANKS as usize];
    comm.allgather(&blocks[me as usize], &mut recv).map_err(e)?;
    check("allgather", &recv, &blocks.concat())?;
    // Allgatherv with zero-sized blocks.
    let counts = [5000usize, 0, 70_001, 0];
    let blocks: Vec<Vec<u8>> = (0..RANKS)
        .map(|r| pattern(3, r, counts[r as usize]))
        .collect();
    let mut recv = vec![0u8; counts.iter().sum()];
    comm.allgatherv(&blocks[me as usize], &mut recv, &counts)
        .map_err(e)?;
    check("allgatherv", &recv, &blocks.concat())?;
    // Typed: u32 broadcast, f32 allgather.
    let want: Vec<u32> = (0..50_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut buf = if me == 3 {
        want.clone()
    } else {
        vec![0u32; want.len()]
    };
    comm.broadcast(3, &mut buf).map_err(e)?;
    check("u32 broadcast", &buf, &want)?;
    let mine: Vec<f32> = (0..3000)
        .map(|i| me as f32 * 1e4 + i as f32 * 0.5)
        .collect();
    let mut recv = vec![0f32; 3000 * RANKS as usize];
    comm.allgather(&mine, &mut recv).map_err(e)?;
    let want: Vec<f32> = (0..RANKS)
        .flat_map(|r| (0..3000).map(move |i| r as f32 * 1e4 + i as f32 * 0.5))
        .collect();
    check("f32 allgather", &recv, &want)?;
    let stats = comm.stats().map_err(e)?;
    if stats.ops_completed != 5 || stats.ops_failed != 0 {
        return Err(format!("ops counted wrong: {stats:?}"));
    }
    Ok(())
}

/// `split` makes one communicator per color, ranked by key, with its own groups: collectives
/// on the parts (over multicast and, small, over TCP) and on the parent run byte for byte,
/// at the same time too; a rank without a color gets none; `dup` ranks as the parent does.
#[test]
fn split_parts_run_their_own_collectives_beside_the_parent() {
    world_with(
        60,
        // Small operations over TCP, large ones over multicast, in the parts as here.
        |b| b.tcp_threshold(64 << 10),
        |comm| {
            let me = comm.rank();
            let sp = |x: ringcast::SplitError| format!("split: {x}");
            // Evens and odds, each ranked in reverse: parent 2 is rank 0 of the evens.
            let part = comm
                .split(Some(me % 2), RANKS - me)
                .map_err(sp)?
                .ok_or("no communicator for a color")?;
            let members: Vec<u32> = (0..RANKS).rev().filter(|r| r % 2 == me % 2).collect();
            let want = members.iter().position(|&r| r == me).unwrap_or(0) as u32;
            if (part.rank(), part.size()) != (want, 2) {
                return Err(format!(
                    "parent rank {me} is {} of {}, want {want} of 2",
                    part.rank(),
                    part.size()
                ));
            }
            // A second split that rank 3 stays out of: three ranks, ranked as the parent.
            let trio = comm.split((me != 3).then_some(9), 0).map_err(sp)?;
            match (&trio, me) {
                (None, 3) => {}
                (Some(t), _) if t.size() == 3 && t.rank() == me => {}
                _ => return Err(format!("second split at {me}: {trio:?}")),
            }
            let dup = comm.dup().map_err(sp)?;
            if (dup.rank(), dup.size()) != (me, RANKS) {
                return Err(format!("dup is {} of {}", dup.rank(), dup.size()));
            }
            // One host (every control address 127.0.0.1): all of them, ranked by key.
            let node = comm.split_by_host(RANKS - me).map_err(sp)?;
            if (node.rank(), node.size()) != (RANKS - 1 - me, RANKS) {
                return Err(format!("host part is {} of {}", node.rank(), node.size()));
            }
            broadcast_checked(&node, "the host part's broadcast", 63, 0, 70_000)?;
            for (salt, len) in [(61u64, 1000usize), (62, (1 << 20) + 3)] {
                // A Broadcast in each part from its rank 0 (parent 2 or 3), and an Allgather
                // in each part, while the parent runs an Allgather of its own.
                let parent_blocks: Vec<Vec<u8>> =
                    (0..RANKS).map(|r| pattern(salt + 10, r, len / 2)).collect();
                let mut parent_recv = vec![0u8; len / 2 * RANKS as usize];
                let on_parent = comm
                    .iallgather(&parent_blocks[me as usize], parent_recv.split_off(0))
                    .map_err(e)?;
                let root_data = pattern(salt, members[0], len);
                let mut b = broadcast_buffer(&part, 0, &root_data);
                part.broadcast(0, &mut b).map_err(e)?;
                check("a part's broadcast", &b, &root_data)?;
                let mine = pattern(salt + 20, me, len);
                let mut recv = vec![0u8; len * 2];
                part.allgather(&mine, &mut recv).map_err(e)?;
                let want: Vec<u8> = members
                    .iter()
                    .flat_map(|&r| pattern(salt + 20, r, len))
                    .collect();
                check("a part's allgather", &recv, &want)?;
                let got = on_parent.wait().map_err(e)?;
                check("the parent's allgather", &got, &parent_blocks.concat())?;
                if let Some(t) = &trio {
                    broadcast_checked(t, "the trio's broadcast", salt + 30, 2, len)?;
                }
                broadcast_checked(&dup, "the dup's broadcast", salt + 40, 1, len)?;
            }
            // Parts of a part.
            let solo = part
                .split(Some(part.rank()), 0)
                .map_err(sp)?
                .ok_or("no solo")?;
            if (solo.rank(), solo.size()) != (0, 1) {
                return Err(format!("solo is {} of {}", solo.rank(), solo.size()));
            }
            broadcast_checked(&solo, "a one-rank broadcast", 70, 0, 5000)?;
            Ok(())
        },
    );
}

/// A rank that posts an Allgather of a split's size where the others split: neither takes
/// the other's bytes (the split's exchange is a collective of its own kind): all fail with
/// `ShapeMismatch`, and the next operation lines up.
#[test]
fn an_allgather_posted_in_a_splits_place_fails_both() {
    for threshold in [0, 64 << 10] {
        world_with(
            64 + threshold,
            move |b| b.tcp_threshold(threshold),
            |comm| {
                let me = comm.rank();
                if me == 0 {
                    let mut recv = vec![0u8; 40 * RANKS as usize];
                    match comm.allgather(&[0u8; 40], &mut recv) {
                        Err(CommError::ShapeMismatch { .. }) => {}
                        other => return Err(format!("the allgather: {other:?} {recv:?}")),
                    }
                } else {
                    match comm.split(Some(0), me) {
                        Err(ringcast::SplitError::Exchange(CommError::ShapeMismatch {
                            ..
                        })) => {}
                        other => return Err(format!("the split: {other:?}")),
                    }
                }
                broadcast_checked(&comm, "after", 65, 1, 3000).map(|_| ())
            },
        );
    }
}

/// A non-blocking call's vector of any element type is the operation's buffer and comes back
/// as itself (the same allocation, no copy), over TCP (small) and over multicast alike; a
/// blocking call writes into the caller's slice.
#[test]
fn typed_vectors_come_back_as_themselves() {
    world_with(
        81,
        |b| b,
        |comm| {
            let me = comm.rank();
            for (n, how) in [(1000usize, "over TCP"), (300_000, "over multicast")] {
                let want: Vec<f64> = (0..n).map(|i| i as f64 * 0.25 + 1.0).collect();
                let v = if me == 1 { want.clone() } else { vec![0f64; n] };
                let at = v.as_ptr();
                let got = comm.ibroadcast(1, v).map_err(e)?.wait().map_err(e)?;
                if got.as_ptr() != at {
                    return Err(format!("f64 Broadcast {how}: another vector came back"));
                }
                check(&format!("f64 Broadcast {how}"), &got, &want)?;
                let block: Vec<u32> = (0..n / 4).map(|i| i as u32 ^ (me << 24)).collect();
                let recv = Vec::with_capacity(block.len() * RANKS as usize + 7);
                let mut recv = recv;
                recv.resize(block.len() * RANKS as usize, 0u32);
                let (at, cap) = (recv.as_ptr(), recv.capacity());
                let got = comm
                    .iallgather(&block, recv)
                    .map_err(e)?
                    .wait()
                    .map_err(e)?;
                if (got.as_ptr(), got.capacity()) != (at, cap) {
                    return Err(format!("u32 Allgather {how}: another vector came back"));
                }
                let want: Vec<u32> = (0..RANKS)
                    .flat_map(|r| (0..n / 4).map(move |i| i as u32 ^ (r << 24)))
                    .collect();
                check(&format!("u32 Allgather {how}"), &got, &want)?;
                // Blocking, on a slice inside a larger vector: only the slice is written.
                let mut outer = vec![7u16; n + 2];
                let counts = vec![n / 4; RANKS as usize];
                let mine: Vec<u16> = (0..n / 4)
                    .map(|i| (i as u16).wrapping_add(me as u16))
                    .collect();
                comm.allgatherv(&mine, &mut outer[1..n + 1], &counts)
                    .map_err(e)?;
                let want: Vec<u16> = (0..RANKS)
                    .flat_map(|r| (0..n / 4).map(move |i| (i as u16).wrapping_add(r as u16)))
                    .collect();
                if (outer[0], outer[n + 1]) != (7, 7) {
                    return Err(format!(
                        "blocking u16 Allgatherv {how}: wrote past the slice"
                    ));
                }
                check(
                    &format!("blocking u16 Allgatherv {how}"),
                    &outer[1..n + 1],
                    &want,
                )?;
            }
            Ok(())
        },
    );
}

/// In-place Allgathers (`MPI_IN_PLACE`): a rank's block already in the buffer, nothing else
/// written by it; small ones over TCP, large ones over multicast (at the threshold between
/// hosts, 64 KiB: the uneven ones of 100-290 KB too), several in flight.
#[test]
fn in_place_allgathers_deliver_every_byte() {
    world_with(
        31,
        |b| b.tcp_threshold(64 << 10),
        |comm| {
            let me = comm.rank() as usize;
            let p = RANKS as usize;
            // A length that is not one block per rank is refused before anything is posted.
            match comm.iallgather_in_place(vec![0u8; 5]) {
                Err(CommError::BufferSize {
                    what: "recv",
                    got: 5,
                    required: 8,
                }) => {}
                other => return Err(format!("5 bytes in place: {:?}", other.map(|_| ()))),
            }
            if comm.allgather_in_place(&mut [0u16; 6]).is_ok() {
                return Err("6 elements in place on 4 ranks passed".into());
            }
            let mut reqs = Vec::new();
            let mut wants = Vec::new();
            // Equal blocks, typed: 100 u32 (over TCP) and 300 000 u32 (over multicast).
            for (i, n) in [100usize, 300_000].into_iter().enumerate() {
                let want: Vec<u32> = (0..n * p)
                    .map(|j| (j as u32).wrapping_mul(2_654_435_761) ^ i as u32)
                    .collect();
                // Every block but this rank's is garbage that must be overwritten.
                let mut buf = vec![0xDEAD_BEEFu32; n * p];
                buf[me * n..(me + 1) * n].copy_from_slice(&want[me * n..(me + 1) * n]);
                reqs.push(comm.iallgather_in_place(buf).map_err(e)?);
                wants.push(want);
            }
            // Uneven blocks with empty ones, bytes.
            for counts in [[7usize, 0, 1000, 3], [0, 200_000, 0, 90_001]] {
                let blocks: Vec<Vec<u8>> = (0..RANKS)
                    .map(|r| pattern(32, r, counts[r as usize]))
                    .collect();
                let at: usize = counts[..me].iter().sum();
                let mut buf = vec![0xA5u8; counts.iter().sum()];
                buf[at..at + counts[me]].copy_from_slice(&blocks[me]);
                let r = comm.iallgatherv_in_place(buf, &counts).map_err(e)?;
                let got = r.wait().map_err(e)?;
                check("allgatherv in place", &got, &blocks.concat())?;
            }
            // Blocking, typed and bytes.
            let want: Vec<u64> = (0..500 * p as u64).map(|j| j * 0x9E37_79B9).collect();
            let mut buf = vec![u64::MAX; want.len()];
            buf[me * 500..(me + 1) * 500].copy_from_slice(&want[me * 500..(me + 1) * 500]);
            comm.allgather_in_place(&mut buf).map_err(e)?;
            check("blocking allgather in place", &buf, &want)?;
            let counts = [0usize, 100_000, 3, 0];
            let blocks: Vec<Vec<u8>> = (0..RANKS)
                .map(|r| pattern(33, r, counts[r as usize]))
                .collect();
            let at: usize = counts[..me].iter().sum();
            let mut buf = vec![0x5Au8; counts.iter().sum()];
            buf[at..at + counts[me]].copy_from_slice(&blocks[me]);
            comm.allgatherv_in_place(&mut buf, &counts).map_err(e)?;
            check("blocking allgatherv in place", &buf, &blocks.concat())?;
            for (i, (r, want)) in reqs.into_iter().zip(wants).enumerate() {
                check(
                    &format!("allgather in place {i}"),
                    &r.wait().map_err(e)?,
                    &want,
                )?;
            }
            Ok(())
        },
    );
}

#[test]
fn with_the_icrc_checked_every_datagram_passes_it() {
    world_with(
        11,
        |b| b.verify_icrc(true).tcp_threshold(0),
        |comm| {
            let me = comm.rank();
            broadcast_checked(&comm, "broadcast", 11, 2, (1 << 20) + 7)?;
            let s = comm.stats().map_err(e)?;
            if s.rx.bad_icrc != 0 || (me != 2 && s.rx.accepted == 0) {
                return Err(format!("ICRC counters: {:?}", s.rx));
            }
            // The root gathered every datagram from the buffer (GSO on loopback), so the ICRCs
            // just checked are those of datagrams sent in place.
            if me == 2 && (s.tx.datagrams == 0 || s.tx.in_place != s.tx.datagrams) {
                return Err(format!("sent in place: {:?}", s.tx));
            }
            Ok(())
        },
    );
}

#[test]
fn several_in_flight_complete_out_of_order() {
    world(2, |comm| {
        let me = comm.rank();
        let b0 = pattern(10, 0, 300_000);
        let b1 = pattern(11, 2, 200_000);
        let blocks: Vec<Vec<u8>> = (0..RANKS).map(|r| pattern(12, r, 40_000)).collect();
        let counts = [0usize, 10_000, 0, 33_333];
        let vblocks: Vec<Vec<u8>> = (0..RANKS)
            .map(|r| pattern(13, r, counts[r as usize]))
            .collect();
        let words: Vec<u64> = (0..RANKS as u64 * 5000).map(|i| i ^ 0xABCD).collect();
        // FSDP-style: post everything, then wait in another order.
        let r0 = comm
            .ibroadcast(
                0,
                if me == 0 {
                    b0.clone()
                } else {
                    vec![0; b0.len()]
                },
            )
            .map_err(e)?;
        let r1 = comm
            .iallgather(&blocks[me as usize], vec![0; 40_000 * RANKS as usize])
            .map_err(e)?;
        let r2 = comm
            .ibroadcast(
                2,
                if me == 2 {
                    b1.clone()
                } else {
                    vec![0; b1.len()]
                },
            )
            .map_err(e)?;
        let r3 = comm
            .iallgatherv(&vblocks[me as usize], vec![0; 43_333], &counts)
            .map_err(e)?;
        let mine = &words[me as usize * 5000..(me as usize + 1) * 5000];
        let mut r4 = comm.iallgather(mine, vec![0u64; words.len()]).map_err(e)?;
        let end = Instant::now() + Duration::from_secs(60);
        while !r4.test() {
            if Instant::now() > end {
                return Err("u64 allgather never finished".into());
            }
            thread::sleep(Duration::from_millis(1));
        }
        check("u64 allgather", &r4.wait().map_err(e)?, &words)?;
        let r3 = match r3.wait_timeout(Duration::from_secs(60)) {
            Ok(r) => r.map_err(e)?,
            Err(_) => return Err("allgatherv timed out".into()),
        };
        check("allgatherv", &r3, &vblocks.concat())?;
        check("broadcast 2", &r2.wait().map_err(e)?, &b1)?;
        check("allgather", &r1.wait().map_err(e)?, &blocks.concat())?;
        check("broadcast 0", &r0.wait().map_err(e)?, &b0)?;
        Ok(())
    });
}

/// Blocking calls, one after the other on the callers' slices: roots and sizes change from
/// call to call, typed and byte slices, Allgatherv with zero blocks after a larger
/// Allgather; every byte right each time.
#[test]
fn blocking_calls_one_after_another_deliver_every_byte() {
    world(5, |comm| {
        let me = comm.rank();
        for (i, len) in [300_000usize, 300_000, 300_000, 70_000, 1 << 20]
            .into_iter()
            .enumerate()
        {
            let root = (i as u32 * 3) % RANKS;
            broadcast_checked(&comm, &format!("broadcast {i}"), 40 + i as u64, root, len)?;
        }
        let words: Vec<u32> = (0..RANKS * 20_000)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let mine = &words[(me * 20_000) as usize..((me + 1) * 20_000) as usize];
        let mut got = vec![0u32; words.len()];
        comm.allgather(mine, &mut got).map_err(e)?;
        check("u32 allgather", &got, &words)?;
        let counts = [0usize, 7, 0, 3];
        let blocks: Vec<Vec<u8>> = (0..RANKS)
            .map(|r| pattern(50, r, counts[r as usize]))
            .collect();
        let mut recv = vec![0u8; 10];
        comm.allgatherv(&blocks[me as usize], &mut recv, &counts)
            .map_err(e)?;
        check("allgatherv after a larger call", &recv, &blocks.concat())?;
        let mut typed = if me == 2 {
            words.clone()
        } else {
            vec![0; words.len()]
        };
        comm.broadcast(2, &mut typed).map_err(e)?;
        check("u32 broadcast", &typed, &words)?;
        Ok(())
    });
}

/// With the TCP threshold at 64 KiB, operations at or below it run over TCP (trees) and the
/// larger ones over multicast, interleaved and in flight together; every buffer byte for byte,
/// and each operation's counters say which path carried it.
#[test]
fn small_operations_run_over_tcp_beside_multicast() {
    const T: u64 = 64 << 10;
    world_with(
        6,
        |b| b.tcp_threshold(T),
        |comm| {
            if comm.tcp_threshold() != T {
                return Err(format!(
                    "threshold {}, want the one set",
                    comm.tcp_threshold()
                ));
            }
            let me = comm.rank();
            let small_b = pattern(30, 1, 4096);
            let edge_b = pattern(31, 3, T as usize);
            let big_b = pattern(32, 2, (1 << 20) + 7);
            let counts = [100usize, 0, 3000, 1];
            let vblocks: Vec<Vec<u8>> = (0..RANKS)
                .map(|r| pattern(33, r, counts[r as usize]))
                .collect();
            let blocks: Vec<Vec<u8>> = (0..RANKS).map(|r| pattern(34, r, 20_000)).collect();
            let bcast = |root: u32, data: &Vec<u8>| ibroadcast_of(&comm, root, data);
            // Small, large, small, large, small: posted together, waited in another order.
            let r_small = bcast(1, &small_b)?;
            let r_big = bcast(2, &big_b)?;
            let r_v = comm
                .iallgatherv(&vblocks[me as usize], vec![0; 3101], &counts)
                .map_err(e)?;
            let r_ag = comm
                .iallgather(&blocks[me as usize], vec![0; 20_000 * RANKS as usize])
                .map_err(e)?;
            let r_edge = bcast(3, &edge_b)?;
            let mut results = Vec::new();
            for (name, req, want, tcp) in [
                ("edge broadcast", r_edge, edge_b, true),
                ("allgather 80 KB", r_ag, blocks.concat(), false),
                ("allgatherv", r_v, vblocks.concat(), true),
                ("large broadcast", r_big, big_b, false),
                ("small broadcast", r_small, small_b, true),
            ] {
                let (got, st) = req.wait_with_stats().map_err(e)?;
                check(name, &got, &want)?;
                results.push((name, st, tcp));
            }
            for (name, st, tcp) in results {
                let c = &st.counters;
                let by_tcp = c.tcp_bytes_sent + c.tcp_bytes_received;
                let by_mcast = c.chunks_sent + c.chunks_received + c.chunks_fetched;
                let ok = if tcp {
                    by_mcast == 0 && by_tcp > 0
                } else {
                    by_tcp == 0 && by_mcast > 0
                };
                if !ok {
                    return Err(format!(
                        "{name}: want it over {}, counters {c:?}",
                        if tcp { "TCP" } else { "multicast" }
                    ));
                }
            }
            if comm.transport_mode().is_tcp() {
                return Err("small operations must not switch the communicator to TCP".into());
            }
            Ok(())
        },
    );
}

/// With no TCP threshold given and every rank on one host (control addresses all 127.0.0.1),
/// the communicator picks the one-host default: a Broadcast of exactly that many bytes runs
/// over TCP, one byte more over multicast; the counters say which.
#[test]
fn the_default_threshold_is_the_one_hosts_on_one_host() {
    const T: usize = ringcast::comm::ONE_HOST_TCP_THRESHOLD as usize;
    world_with(
        72,
        |b| b,
        |comm| {
            if comm.tcp_threshold() != T as u64 {
                return Err(format!("threshold {}, want {T}", comm.tcp_threshold()));
            }
            for (len, tcp) in [(T, true), (T + 1, false)] {
                let want = pattern(72, 1, len);
                let mut buf = if comm.rank() == 1 {
                    want.clone()
                } else {
                    vec![0; len]
                };
                let st = comm.broadcast(1, &mut buf).map_err(e)?;
                check(&format!("broadcast of {len} B"), &buf, &want)?;
                let c = &st.counters;
                let by_tcp = c.tcp_bytes_sent + c.tcp_bytes_received;
                let by_mcast = c.chunks_sent + c.chunks_received + c.chunks_fetched;
                if (by_tcp > 0, by_mcast > 0) != (tcp, !tcp) {
                    return Err(format!(
                        "{len} B: want it over {}, counters {c:?}",
                        if tcp { "TCP" } else { "multicast" }
                    ));
                }
            }
            Ok(())
        },
    );
}

/// Many operations over TCP, then one over multicast, posted without waiting: the ranks that
/// post first are a hundred ids ahead of a rank that has not posted yet (its engine takes the
/// ids of the TCP operations only as they are posted), and their `Ready`s for the multicast
/// operation reach it that far ahead. They are kept, and the operation completes (they were
/// dropped as noise once, and the operation failed at the peer timeout).
#[test]
fn a_multicast_operation_after_many_tcp_ones_waits_for_a_late_rank() {
    const SMALL: usize = 100;
    world_with(
        12,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_secs(3))
        },
        |comm| {
            let me = comm.rank();
            if me == 0 {
                thread::sleep(Duration::from_millis(300));
            }
            let smalls: Vec<Vec<u8>> = (0..SMALL).map(|i| pattern(40, i as u32, 1000)).collect();
            let big = pattern(41, 0, (1 << 20) + 5);
            let post = |data: &Vec<u8>| ibroadcast_of(&comm, 0, data);
            let mut reqs = Vec::new();
            for s in &smalls {
                reqs.push(post(s)?);
            }
            let r_big = post(&big)?;
            let (got, st) = r_big.wait_with_stats().map_err(e)?;
            check("large broadcast", &got, &big)?;
            if st.counters.tcp_bytes_sent + st.counters.tcp_bytes_received != 0 {
                return Err(format!("the large one ran over TCP: {:?}", st.counters));
            }
            for (i, (r, want)) in reqs.into_iter().zip(&smalls).enumerate() {
                check(&format!("small broadcast {i}"), &r.wait().map_err(e)?, want)?;
            }
            Ok(())
        },
    );
}

/// A root that broadcasts small buffers back to back (blocking, no barrier) while the other
/// ranks start late: it runs a window of operations ahead of them, then waits for them (its
/// pieces would otherwise pile up at ranks that have not posted), and every buffer arrives,
/// the multicast one among them too.
#[test]
fn a_root_running_ahead_of_late_ranks_delivers_every_byte() {
    const OPS: u32 = 400;
    const SMALL: usize = 64 << 10;
    world_with(
        13,
        |b| b.tcp_threshold(SMALL as u64),
        |comm| {
            if comm.rank() != 0 {
                thread::sleep(Duration::from_millis(500));
            }
            for i in 0..OPS {
                // One of them too large for TCP, past the window: over multicast.
                let len = if i == 300 { 5 * SMALL } else { SMALL };
                broadcast_checked(&comm, &format!("broadcast {i}"), 50 + u64::from(i), 0, len)?;
            }
            Ok(())
        },
    );
}

/// A multicast operation in flight (rank 3 posts late) while 4095 TCP operations are posted
/// behind it: the next multicast operation's id is 4096 (the number of immediate tags) after
/// the first's, so it would have the first one's tag. It waits until the first has ended,
/// and both deliver their own bytes.
#[test]
fn a_multicast_operation_whose_tag_is_in_flight_waits_for_it() {
    const SMALL: usize = 4095;
    world_with(
        13,
        |b| b.tcp_threshold(64 << 10),
        |comm| {
            let me = comm.rank();
            if me == 3 {
                thread::sleep(Duration::from_millis(300));
            }
            let post = |data: &Vec<u8>| ibroadcast_of(&comm, 1, data);
            let first = pattern(42, 1, (2 << 20) + 3);
            let second = pattern(43, 1, (1 << 20) + 9);
            let r_first = post(&first)?;
            let mut smalls = Vec::new();
            for i in 0..SMALL {
                let data = vec![(i % 251) as u8; 16];
                smalls.push((post(&data)?, data));
            }
            let r_second = post(&second)?;
            check("second", &r_second.wait().map_err(e)?, &second)?;
            check("first", &r_first.wait().map_err(e)?, &first)?;
            for (i, (r, want)) in smalls.into_iter().enumerate() {
                check(&format!("small {i}"), &r.wait().map_err(e)?, &want)?;
            }
            Ok(())
        },
    );
}

/// A seeded random mix, the same on every rank: Broadcasts from any root, Allgathers and
/// Allgathervs (zero-sized blocks included), from 0 bytes to 1 MiB, so that each runs over TCP
/// or multicast by its size; posted a few at a time without waiting and waited in a random
/// order, or run blocking. Every result is checked byte for byte. `RINGCAST_SOAK_OPS` sets
/// how many (default 300).
#[test]
fn a_random_mix_of_operations_delivers_every_byte() {
    random_mix(15, 64 << 10);
}

/// [`a_random_mix_of_operations_delivers_every_byte`] with every operation over multicast,
/// the smallest too.
#[test]
fn a_random_mix_all_over_multicast_delivers_every_byte() {
    random_mix(16, 0);
}

fn random_mix(salt: u64, tcp_threshold: u64) {
    let seed = nonce(salt);
    world_with(
        salt,
        move |b| b.tcp_threshold(tcp_threshold),
        move |comm| random_ops(&comm, seed, soak_ops()),
    );
}

#[test]
fn a_rank_that_stops_fails_the_others_naming_it() {
    const GONE: u32 = 3;
    // The survivors keep their communicators until each has seen both failures: one that
    // left at once would be a second lost rank, and the others might hear of it first.
    let done = std::sync::Arc::new(std::sync::Barrier::new(RANKS as usize - 1));
    let got = world(3, move |comm| {
        let me = comm.rank();
        // Everyone is up and connected.
        let mut x = vec![me as u8; 8];
        comm.broadcast(0, &mut x).map_err(e)?;
        let len = 4 << 20;
        let buf = if me == 0 {
            pattern(4, 0, len)
        } else {
            vec![0; len]
        };
        let req = comm.ibroadcast(0, buf).map_err(e)?;
        if me == GONE {
            // Stops mid-operation: its own request is cancelled, promptly.
            drop(comm);
            return match req.wait() {
                Err(CommError::Cancelled) => Ok(None),
                other => Err(format!("the stopped rank's request: {other:?}")),
            };
        }
        let err = match req.wait() {
            Err(err) => err,
            Ok(_) => return Err("completed without rank 3".into()),
        };
        // The communicator is broken from now on: a later post fails at once, naming it.
        let later = comm.ibroadcast(0, vec![0u8; 16]).map_err(e)?.wait();
        done.wait();
        Ok(Some((err, later)))
    });
    for (r, g) in got.into_iter().enumerate() {
        let Some((err, later)) = g else {
            continue;
        };
        assert_eq!(err.peer(), Some(GONE), "rank {r}: {err}");
        assert_eq!(
            later.map(|_| ()),
            Err(CommError::PeerLost { peer: GONE }),
            "rank {r}"
        );
    }
}

#[test]
fn dropping_with_requests_in_flight_returns_promptly() {
    world(4, |comm| {
        let me = comm.rank();
        let mut reqs = Vec::new();
        for k in 0..4u32 {
            let buf = vec![me as u8; 2 << 20];
            reqs.push(comm.ibroadcast(k % RANKS, buf).map_err(e)?);
        }
        // One request leaked outright: the engine still owns its buffer.
        std::mem::forget(comm.ibroadcast(1, vec![0u8; 1 << 20]).map_err(e)?);
        drop(comm);
        settled(reqs)
    });
}

/// `abort` from a watchdog thread, while the application thread is blocked: the waits in
/// flight (a multicast Broadcast and a TCP Allgather that the others never post) return
/// `Cancelled`, later calls fail at once the same way, and the peers' next operation fails
/// naming the aborted rank.
#[test]
fn an_abort_from_another_thread_cancels_the_waits_and_the_peers_name_this_rank() {
    world_with(
        5,
        |b| b.tcp_threshold(64 << 10),
        |comm| {
            let me = comm.rank();
            broadcast_checked(&comm, "before", 50, 2, 100_000)?;
            let comm = Arc::new(comm);
            if me == 0 {
                let big = comm.ibroadcast(0, vec![7u8; 4 << 20]).map_err(e)?;
                let small = comm.iallgather(&[1u8; 100], vec![0u8; 400]).map_err(e)?;
                let watchdog = {
                    let comm = Arc::clone(&comm);
                    thread::spawn(move || {
                        thread::sleep(Duration::from_millis(300));
                        comm.abort();
                        comm.abort();
                    })
                };
                // Blocked here until the watchdog aborts.
                let got = (big.wait().err(), small.wait().err());
                watchdog.join().map_err(|_| "watchdog panicked")?;
                if got != (Some(CommError::Cancelled), Some(CommError::Cancelled)) {
                    return Err(format!("waits after the abort: {got:?}"));
                }
                let mut x = [0u8; 8];
                for (what, r) in [
                    ("broadcast", comm.broadcast(1, &mut x).err()),
                    (
                        "allgather",
                        comm.allgather(&[0u8; 1 << 20], &mut vec![0u8; 4 << 20])
                            .err(),
                    ),
                ] {
                    if r != Some(CommError::Cancelled) {
                        return Err(format!("a {what} after the abort: {r:?}"));
                    }
                }
                return Ok(());
            }
            // The others post only once rank 0 is gone.
            thread::sleep(Duration::from_millis(800));
            let mut buf = vec![0u8; 1 << 20];
            match comm.broadcast(1, &mut buf) {
                Err(err) if err.peer() == Some(0) => Ok(()),
                other => Err(format!("after rank 0's abort: {other:?}")),
            }
        },
    );
}

/// Every request of a dropped communicator ends: completed, cancelled, or failed because a
/// peer left (another rank that saw a leaver first may tell us through `Abort`).
fn settled(reqs: Vec<ringcast::Request<u8>>) -> Result<(), String> {
    for r in reqs {
        match r.wait() {
            Ok(_)
            | Err(CommError::Cancelled)
            | Err(CommError::PeerLost { .. })
            | Err(CommError::PeerFailed { .. }) => {}
            Err(other) => return Err(format!("unexpected: {other}")),
        }
    }
    Ok(())
}

/// No rank leaves a barrier before every rank reached it: each records its arrival (ranks
/// arrive one after another, rank 3 last) and checks, once out, that every rank's is there.
/// Over the TCP trees (the default threshold) and over multicast (threshold 0).
#[test]
fn no_rank_leaves_a_barrier_before_every_rank_reached_it() {
    for (salt, threshold) in [(15, 64 << 10), (16, 0)] {
        let arrived = Arc::new(std::sync::Mutex::new(Vec::new()));
        world_with(
            salt,
            move |b| b.tcp_threshold(threshold),
            move |comm| {
                let me = comm.rank();
                for round in 0..3u32 {
                    thread::sleep(Duration::from_millis(u64::from(me) * 20));
                    let lock = || arrived.lock().map_err(|_| "poisoned".to_owned());
                    lock()?.push((round, me));
                    comm.barrier().map_err(e)?;
                    let seen = lock()?;
                    let here = seen.iter().filter(|(r, _)| *r == round).count();
                    if here != RANKS as usize {
                        return Err(format!("round {round}: left with {here} ranks arrived"));
                    }
                }
                Ok(())
            },
        );
    }
}

/// An erroneous program: ranks 1 and 3 broadcast 70 000 bytes where ranks 0 and 2 broadcast
/// 60 000, across the TCP threshold, so the ranks disagree on where the operation runs. No
/// rank may end up with another operation's bytes: every result is the right one or an
/// error, and the operations after it, on which the ranks agree, still line up (the ranks
/// that ran it over TCP skipped its id in the multicast engine, and the hub that skipped it
/// tells the ranks that started it).
#[test]
fn ranks_disagreeing_on_a_length_get_errors_never_other_bytes() {
    let got = world_with(
        8,
        |b| b.tcp_threshold(65_000).peer_timeout(Duration::from_secs(2)),
        |comm| {
            let me = comm.rank();
            let lens = [60_000usize, 70_000, 60_000, 70_000];
            let a = pattern(80, 0, lens[me as usize]);
            let big = pattern(81, 0, 1 << 20);
            let small = pattern(82, 0, 4096);
            let post = |data: &Vec<u8>| ibroadcast_of(&comm, 0, data);
            let reqs = [post(&a)?, post(&big)?, post(&small)?];
            let mut verdicts = Vec::new();
            for (name, req, want) in [("a", &a, ()), ("big", &big, ()), ("small", &small, ())]
                .into_iter()
                .zip(reqs)
                .map(|((n, w, ()), r)| (n, r, w))
            {
                match req.wait() {
                    Ok(v) if v == *want => verdicts.push(format!("{name} ok")),
                    Ok(v) => {
                        return Err(format!(
                            "{name}: completed with other bytes than the root's ({} bytes)",
                            v.len()
                        ));
                    }
                    Err(err) => verdicts.push(format!("{name} failed: {err}")),
                }
            }
            Ok(verdicts)
        },
    );
    // The operations every rank agrees on complete everywhere.
    for (r, v) in got.iter().enumerate() {
        assert_eq!(v[1], "big ok", "rank {r}: {v:?}");
        assert_eq!(v[2], "small ok", "rank {r}: {v:?}");
    }
    // Ranks 1 and 3 started it over multicast: the first `Ready` to reach rank 0, the hub,
    // which skipped it, made it tell them (not their peer timeout).
    for r in [1, 3] {
        let told = [1, 3].map(|x| format!("a failed: rank {x} posted this operation with another"));
        assert!(
            told.iter().any(|t| got[r][0].starts_with(t)),
            "rank {r}: {:?}",
            got[r]
        );
    }
}

/// Across the threshold again, with a rank that runs the operation over multicast in the
/// middle of the TCP tree: rank 2 posts 70 000 bytes where the others post 60 000 (threshold
/// 65 000), and rank 3 takes its pieces from rank 2 (the tree from rank 0). Rank 2's
/// dispatcher gets rank 0's piece of an operation it ran over multicast and tells every rank,
/// so rank 3 fails at once instead of at the (one-minute) peer timeout; rank 0, the hub that
/// skipped it, tells rank 2.
#[test]
fn a_rank_that_ran_an_operation_over_multicast_tells_the_tcp_ranks_waiting_on_it() {
    let all = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        14,
        |b| {
            b.tcp_threshold(65_000)
                .peer_timeout(Duration::from_secs(60))
        },
        move |comm| {
            let me = comm.rank();
            let len = if me == 2 { 70_000 } else { 60_000 };
            let want = pattern(95, 0, len);
            let buf = if me == 0 { want.clone() } else { vec![0; len] };
            let got = comm.ibroadcast(0, buf).map_err(e)?.wait();
            match me {
                2 => disagreed("multicast rank", got, &want, &[(2, 0)], false)?,
                3 => disagreed("its child", got, &want, &[(0, 2)], false)?,
                _ => disagreed("the others", got, &want, &[(0, 2)], true)?,
            }
            broadcast_checked(&comm, "after", 96, 1, 1 << 20)?;
            broadcast_checked(&comm, "small after", 97, 3, 1000)?;
            all.wait();
            Ok(())
        },
    );
}

/// An erroneous program: rank 1 passes a root that does not exist where the others pass
/// rank 0, so its call fails at once, before anything is posted. Its place in the sequence
/// of collectives is taken all the same: the others' operation fails naming rank 1 (or
/// completes with the root's bytes, upstream of rank 1 over TCP) and the Broadcasts after it, on which every
/// rank agrees, deliver the root's bytes everywhere, not those of the operation before.
/// Small (over TCP) and large (over multicast), with and without the TCP path.
#[test]
fn a_call_refused_at_one_rank_does_not_shift_the_others() {
    for (salt, threshold, len, refuser) in [
        (30, 64 << 10, 4096, 1),
        (31, 64 << 10, 1 << 20, 1),
        (32, 0, 4096, 1),
        // Over TCP, rank 2 refusing: a piece of it reached rank 2, which named the piece's
        // sender (rank 0, the root) before it named itself.
        (39, 64 << 10, 1000, 2),
    ] {
        world_with(
            salt,
            move |b| {
                b.tcp_threshold(threshold)
                    .peer_timeout(Duration::from_secs(2))
            },
            move |comm| {
                let me = comm.rank();
                let want = pattern(salt, 0, len);
                if me == refuser {
                    match comm.ibroadcast(99, vec![0u8; len]) {
                        Err(CommError::RootOutOfRange { root: 99, .. }) => {}
                        other => return Err(format!("a root out of range: {:?}", other.err())),
                    }
                } else {
                    match ibroadcast_of(&comm, 0, &want)?.wait() {
                        // Failed naming the rank that refused, which told them at once
                        // (they named another rank over TCP, or the first to say `Ready`,
                        // and over multicast waited for the hub's deadline, before
                        // `refuse_op`).
                        Err(e @ CommError::ShapeMismatch { .. }) if e.peer() == Some(refuser) => {}
                        Err(e) => return Err(format!("{threshold}/{len}: {e:?}")),
                        Ok(v) if v == want => {}
                        Ok(_) => return Err(format!("{threshold}/{len}: other bytes")),
                    }
                }
                for (k, l) in [len, 4096, 1 << 20].into_iter().enumerate() {
                    let what = format!("{threshold}/{len}: broadcast {k} after");
                    broadcast_checked(&comm, &what, salt + 100 + k as u64, 0, l)?;
                }
                Ok(())
            },
        );
    }
}

/// Rank 0, the Broadcast's root and its barrier's hub, refuses its call (a root out of
/// range) over multicast: it tells the others at once, naming itself. They named the first
/// rank whose `Ready` reached it (a rank that posted the operation correctly) before
/// `Session::refuse_op`.
#[test]
fn a_call_refused_at_the_hub_names_the_hub() {
    world_with(
        36,
        |b| b.tcp_threshold(0).peer_timeout(Duration::from_secs(5)),
        |comm| {
            let me = comm.rank();
            let len = 1 << 20;
            if me == 0 {
                match comm.ibroadcast(99, vec![0u8; len]) {
                    Err(CommError::RootOutOfRange { root: 99, .. }) => {}
                    other => return Err(format!("a root out of range: {:?}", other.err())),
                }
            } else {
                match ibroadcast_of(&comm, 0, &pattern(36, 0, len))?.wait() {
                    Err(CommError::ShapeMismatch {
                        peer: 0,
                        reported_by: 0,
                    }) => {}
                    other => {
                        return Err(format!(
                            "rank {me}, beside rank 0's refusal: {:?}",
                            other.map(|v| v.len())
                        ));
                    }
                }
            }
            for k in 0..2u64 {
                broadcast_checked(&comm, &format!("broadcast {k} after"), 37 + k, 0, 20_000)?;
            }
            Ok(())
        },
    );
}

/// Ranks that disagree on a Broadcast's length, so that only the root's is too large for
/// the chunk size (`StartError::TooLarge`, found by the engine once posted): the root's id
/// is taken all the same, and the operations after it line up.
#[test]
fn an_operation_one_rank_cannot_start_does_not_shift_the_others() {
    world_with(
        33,
        |b| {
            b.tcp_threshold(0)
                .chunk_size(16)
                .peer_timeout(Duration::from_secs(2))
        },
        |comm| {
            let me = comm.rank();
            // 16-byte chunks: 20 MB is more chunks than an operation may have.
            let len = if me == 0 { 20_000_000 } else { 200_000 };
            let got = ibroadcast_of(&comm, 0, &pattern(34, 0, len))?.wait();
            match (me, got) {
                (0, Err(CommError::Start(_))) | (1.., Err(_)) => {}
                (_, other) => return Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
            for k in 0..3 {
                broadcast_checked(&comm, &format!("broadcast {k} after"), 35 + k, 0, 20_000)?;
            }
            Ok(())
        },
    );
}

/// An erroneous program over TCP: rank 1 posts a small Allgather with no bytes where the
/// others post 8 per rank. The others' Bruck rounds reach it (whether it completed already
/// or not): it tells them, and every rank fails the operation at once (`ShapeMismatch`), not
/// at the peer timeout (a minute here); the next operation lines up everywhere.
#[test]
fn an_allgather_empty_at_one_rank_fails_at_the_others_at_once() {
    world_with(
        36,
        |b| b.peer_timeout(Duration::from_secs(60)),
        |comm| {
            let me = comm.rank();
            let got = if me == 1 {
                comm.iallgatherv(&[0u8; 0], Vec::new(), &[0; RANKS as usize])
            } else {
                comm.iallgather(&[me as u8; 8], vec![0; 8 * RANKS as usize])
            }
            .map_err(e)?
            .wait();
            match (me, got) {
                (1, Ok(v)) if v.is_empty() => {}
                (_, Err(CommError::ShapeMismatch { .. })) => {}
                (_, other) => return Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
            broadcast_checked(&comm, "after", 37, 2, 4096)?;
            Ok(())
        },
    );
}

/// The same with a Broadcast: rank 2, inside the tree from rank 0 (its child is rank 3),
/// posts it empty and completes at once. Rank 0's piece reaches it afterwards: it tells the
/// ranks, and rank 3, which waits on it, fails at once instead of at the peer timeout.
#[test]
fn a_broadcast_empty_inside_the_tree_fails_below_it_at_once() {
    an_empty_broadcast_at_one_rank(38, 64 << 10, 2, 1000, &[3]);
}

/// And with a chain: everything over TCP, rank 1 posts a Broadcast empty where the others
/// post 300 000 bytes (more than a piece: a chain, rank 1 the root's next hop). Rank 1
/// completes at once and sends no clear-to-send; the root's shape piece reaches it
/// afterwards, and it tells the ranks, which fail at once instead of at the peer timeout.
#[test]
fn a_broadcast_empty_at_the_roots_next_hop_fails_the_chain_at_once() {
    an_empty_broadcast_at_one_rank(41, 1 << 30, 1, 300_000, &[0, 2, 3]);
}

/// Rank `empty` posts a Broadcast from rank 0 empty where the others post `len` bytes (TCP
/// threshold `threshold`, peer timeout a minute): the ranks in `must_fail` fail it with
/// `ShapeMismatch`, the others may instead complete it (empty, or with the root's bytes),
/// and the next Broadcast lines up everywhere. Every rank stays until all are done: the
/// empty rank tells the others when a piece of the operation reaches it, which on a loaded
/// machine can be after it finished both operations (it left then, with the piece unread,
/// and the rank below it waited for it until the peer timeout: 1 run in 30 with two busy
/// loops beside it).
fn an_empty_broadcast_at_one_rank(
    salt: u64,
    threshold: u64,
    empty: u32,
    len: usize,
    must_fail: &'static [u32],
) {
    let all = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        salt,
        move |b| {
            b.tcp_threshold(threshold)
                .peer_timeout(Duration::from_secs(60))
        },
        move |comm| {
            let me = comm.rank();
            let want = pattern(salt, 0, if me == empty { 0 } else { len });
            let got = ibroadcast_of(&comm, 0, &want)?.wait();
            match got {
                Err(CommError::ShapeMismatch { .. }) => {}
                Ok(v) if v == want && !must_fail.contains(&me) => {}
                other => return Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
            broadcast_checked(&comm, "after", salt + 1, 2, 4096)?;
            all.wait();
            Ok(())
        },
    );
}

/// Ranks 0-2 fail a multicast Allgather that rank 3 posts later than the post timeout
/// (naming it), and leave. Their goodbye names rank 3: its operation, posted afterwards,
/// fails at once with `PeerLost`, where it ran against the departed peers until its own
/// deadlines (3.5 peer timeouts) and then blamed rank 0 as unresponsive. (Or, when its
/// engine takes the post before the departures, as the hub told it: `PeerFailed` naming
/// itself. Seen once in ten loaded runs of the whole suite.)
#[test]
fn a_late_rank_that_the_others_left_over_fails_at_once() {
    world_with(
        47,
        |b| {
            b.tcp_threshold(0)
                .peer_timeout(Duration::from_secs(1))
                .post_timeout(Duration::from_secs(2))
        },
        |comm| {
            let me = comm.rank();
            if me == 3 {
                thread::sleep(Duration::from_secs(5));
            }
            let got = comm.iallgather(&[me as u8; 1 << 18], vec![0; 1 << 20]);
            match (me, got.map_err(e)?.wait()) {
                (3, Err(CommError::PeerLost { .. } | CommError::PeerFailed { peer: 3, .. })) => {
                    Ok(())
                }
                (0..=2, Err(err)) if err.peer() == Some(3) => Ok(()),
                (_, other) => Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
        },
    );
}

/// A rank that posts six peer timeouts after the others (an application that loads a
/// checkpoint on one rank first) is alive, not hung: its peers ask it where it stands and
/// wait, over multicast and over TCP alike, and every operation completes with the right
/// bytes. Rank 0 is the Broadcast's root and the barrier's hub; rank 2 a leaf.
#[test]
fn a_rank_that_posts_late_is_waited_for() {
    for (salt, threshold, late) in [(61, 0, 0), (62, 0, 2), (63, 64 << 10, 0), (64, 64 << 10, 2)] {
        world_with(
            salt,
            move |b| {
                b.tcp_threshold(threshold)
                    .peer_timeout(Duration::from_millis(500))
            },
            move |comm| {
                let me = comm.rank();
                let len = if threshold == 0 { 1 << 20 } else { 4096 };
                if me == late {
                    thread::sleep(Duration::from_secs(3));
                }
                let want = pattern(salt, 0, len);
                let mut got = if me == 0 { want.clone() } else { vec![0; len] };
                comm.broadcast(0, &mut got).map_err(e)?;
                if got != want {
                    return Err(format!("rank {me}: wrong Broadcast bytes"));
                }
                // And an Allgather after it, the late rank late again.
                if me == late {
                    thread::sleep(Duration::from_secs(3));
                }
                let mine = pattern(salt, me, len / 4);
                let mut all = vec![0; len];
                comm.allgather(&mine, &mut all).map_err(e)?;
                for r in 0..RANKS {
                    let at = r as usize * len / 4;
                    if all[at..at + len / 4] != pattern(salt, r, len / 4)[..] {
                        return Err(format!("rank {me}: wrong block {r}"));
                    }
                }
                Ok(())
            },
        );
    }
}

/// Rank 2 never posts a small Allgather (over TCP): the others fail it naming rank 2, and
/// rank 1 leaves over that failure. A large Broadcast posted next (over multicast) fails
/// naming rank 2, as every post after a failure names its culprit: the engine and the TCP
/// path share whom this rank blames, and rank 1's goodbye on the engine's mesh names it too
/// (each side kept its own: the Broadcast named rank 1, which left). Found by an audit. It
/// fails with `PeerFailed`, as a TCP operation doomed the same way does (it said `PeerLost`:
/// rank 2's connection closed, which it had not).
#[test]
fn a_multicast_post_after_a_tcp_failure_names_its_culprit() {
    // Rank 2 stays until ranks 0 and 3 are done (its departure would doom the Broadcast).
    let done = Arc::new(Barrier::new(3));
    world_with(
        91,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_secs(1))
                .post_timeout(Duration::from_secs(2))
        },
        move |comm| {
            let me = comm.rank();
            if me == 2 {
                done.wait();
                return Ok(());
            }
            let mut all = vec![0u8; 32];
            match comm.allgather(&[me as u8; 8], &mut all) {
                Err(e) if e.peer() == Some(2) => {}
                other => return Err(format!("rank {me}: the Allgather: {other:?}")),
            }
            if me == 1 {
                return Ok(());
            }
            // Rank 1 is gone by then.
            thread::sleep(Duration::from_millis(1500));
            let mut buf = vec![me as u8; 1 << 20];
            let got = comm.broadcast(0, &mut buf);
            done.wait();
            // Rank 2 is alive: it failed, it is not gone (the TCP path says so too).
            match got {
                Err(CommError::PeerFailed { peer: 2, .. }) => Ok(()),
                other => Err(format!("rank {me}: the Broadcast: {other:?}")),
            }
        },
    );
}

/// Over TCP (the default threshold): a 32-byte Allgather, this rank's 8 bytes.
fn small_allgather(comm: &Communicator) -> Result<(), CommError> {
    let me = comm.rank() as u8;
    comm.allgather(&[me; 8], &mut [0u8; 32]).map(drop)
}

/// Over multicast: a 1 MiB Broadcast from rank 0.
fn large_broadcast(comm: &Communicator) -> Result<(), CommError> {
    comm.broadcast(0, &mut vec![comm.rank() as u8; 1 << 20])
        .map(drop)
}

/// Rank 2 never posts `first`: every rank fails it naming rank 2, and rank 1's program stops
/// there (it posts nothing more, its communicator alive). `second`, which ranks 0 and 3 post
/// next, waits on rank 1, asks it where it stands, hears that its last operation failed over
/// rank 2, and fails naming rank 2 at once, not rank 1 at the post timeout, whichever path
/// each runs on (each path knew only of its own failures: the TCP path's answer, and the
/// engine's session, said rank 1 had not posted).
fn a_rank_stopped_over_a_failure_names_it(
    salt: u64,
    first: fn(&Communicator) -> Result<(), CommError>,
    second: fn(&Communicator) -> Result<(), CommError>,
) {
    // Ranks 1 and 2 stay until ranks 0 and 3 are done.
    let done = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        salt,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_secs(1))
                .post_timeout(Duration::from_secs(4))
        },
        move |comm| {
            let me = comm.rank();
            if me == 2 {
                done.wait();
                return Ok(());
            }
            match first(&comm) {
                Err(e) if e.peer() == Some(2) => {}
                other => return Err(format!("rank {me}: the first operation: {other:?}")),
            }
            if me == 1 {
                done.wait();
                return Ok(());
            }
            let got = second(&comm);
            done.wait();
            match got {
                Err(e) if e.peer() == Some(2) => Ok(()),
                other => Err(format!("rank {me}: the second operation: {other:?}")),
            }
        },
    );
}

#[test]
fn a_tcp_wait_on_a_rank_stopped_by_a_multicast_failure_names_that_failure() {
    a_rank_stopped_over_a_failure_names_it(92, large_broadcast, small_allgather);
}

#[test]
fn a_multicast_wait_on_a_rank_stopped_by_a_tcp_failure_names_that_failure() {
    a_rank_stopped_over_a_failure_names_it(93, small_allgather, large_broadcast);
}

/// A world in which rank 1 answers but never posts (its program is stuck before the call):
/// the other ranks run `f` with `threshold` and `post` (the post timeout); rank 1 stays,
/// answering, until they are done.
fn rank_1_never_posts(
    salt: u64,
    threshold: u64,
    post: Duration,
    f: impl Fn(&Communicator) -> Result<(), String> + Send + Sync + Clone + 'static,
) {
    let release = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        salt,
        move |b| {
            b.tcp_threshold(threshold)
                .peer_timeout(Duration::from_secs(1))
                .post_timeout(post)
        },
        move |comm| {
            let out = if comm.rank() == 1 { Ok(()) } else { f(&comm) };
            release.wait();
            out
        },
    );
}

/// A rank that answers but never posts fails an Allgather everywhere at the post timeout,
/// naming it: over multicast and over TCP. (A TCP Broadcast completes at the ranks that do
/// not need the missing one, as MPI's may.)
#[test]
fn a_rank_that_never_posts_fails_the_operation_at_the_post_timeout() {
    for (salt, threshold) in [(65, 0), (66, 64 << 10)] {
        rank_1_never_posts(salt, threshold, Duration::from_secs(3), |comm| {
            let me = comm.rank();
            let t = Instant::now();
            match comm.allgather(&[me as u8; 1024], &mut [0u8; 4096]) {
                Err(CommError::NotPosted { peer: 1 })
                | Err(CommError::PeerFailed { peer: 1, .. }) => {
                    // The engine's clock reads the start a little before `t`: a lower bound
                    // with room, far above the 1.5 s of a hung rank's.
                    if t.elapsed() < Duration::from_millis(2500) {
                        Err(format!("rank {me}: failed after {:?}", t.elapsed()))
                    } else {
                        Ok(())
                    }
                }
                other => Err(format!("rank {me}: {other:?}")),
            }
        });
    }
}

/// Behind a rank that never posts, more operations queued than the session runs at once
/// all fail within about one post timeout, naming it: the ones queued behind the first
/// failure fail with it (each window of them used to wait a post timeout of its own: 200
/// queued here, 8 s for the last instead of 2).
#[test]
fn operations_queued_behind_a_rank_that_never_posts_fail_by_their_post_timeout() {
    const OPS: usize = 200;
    const POST: Duration = Duration::from_secs(2);
    // Over multicast, and over TCP (small operations; its dispatcher did so already).
    for (salt, threshold) in [(94, 0), (95, 64 << 10)] {
        rank_1_never_posts(salt, threshold, POST, move |comm| {
            let me = comm.rank();
            let requests = (0..OPS)
                .map(|_| comm.iallgather(&[me as u8; 256], vec![0u8; 1024]))
                .collect::<Result<Vec<_>, _>>()
                .map_err(e)?;
            let mut bad = None;
            let mut first = None;
            for r in requests {
                match r.wait() {
                    Err(CommError::NotPosted { peer: 1 })
                    | Err(CommError::PeerFailed { peer: 1, .. }) => {}
                    other => bad = bad.or(Some(format!("{:?}", other.map(|_| ())))),
                }
                first.get_or_insert_with(Instant::now);
            }
            // From the first failure to the last: without failing the queued ones, 6 s over
            // multicast (2, 4, 6 and 8 s after the posts, a window of 64 at a time).
            let spread = first.map_or(Duration::ZERO, |f| f.elapsed());
            match bad {
                Some(b) => Err(format!("rank {me} ({threshold}): {b}")),
                None if spread > POST => Err(format!(
                    "rank {me} ({threshold}): the last failed {spread:?} after the first"
                )),
                None => Ok(()),
            }
        });
    }
}

/// The same with small operations over TCP in flight beside multicast ones: dropping the
/// communicator cancels both kinds, and the engine and the dispatcher both stop.
#[test]
fn dropping_with_small_operations_in_flight_returns_promptly() {
    world_with(
        7,
        |b| b.tcp_threshold(64 << 10),
        |comm| {
            let me = comm.rank();
            let mut reqs = Vec::new();
            for k in 0..6u32 {
                let len = if k % 2 == 0 { 4096 } else { 1 << 20 };
                reqs.push(comm.ibroadcast(k % RANKS, vec![me as u8; len]).map_err(e)?);
            }
            std::mem::forget(comm.ibroadcast(2, vec![0u8; 1000]).map_err(e)?);
            drop(comm);
            settled(reqs)
        },
    );
}

/// Two jobs meeting on one rendezvous port (the same `host:port` given to both): a rank of
/// the other job (`job_id`) is refused with a message saying so, and the job's own ranks meet
/// and run. Without job ids the stranger would have joined as rank 1.
#[test]
fn a_job_id_keeps_two_jobs_on_one_rendezvous_port_apart() {
    let port = free_tcp_port();
    let at = format!("127.0.0.1:{port}");
    let rank = |r: u32, job: &str| {
        Communicator::builder()
            .rank(r)
            .world_size(2)
            .rendezvous(&at)
            .job_id(job)
            .connect_timeout(Duration::from_secs(20))
    };
    thread::scope(|s| {
        let zero = s.spawn(|| rank(0, "job-a").build());
        let stranger = rank(1, "job-b").build().err().map(|e| e.to_string());
        let text = stranger.expect("the other job's rank was admitted");
        assert!(text.contains("belongs to another job"), "{text}");
        let one = rank(1, "job-a").build().expect("rank 1 of job-a");
        let zero = zero.join().expect("no panic").expect("rank 0 of job-a");
        let sent = s.spawn(move || zero.broadcast(0, &mut vec![7u8; 100_000]));
        let mut got = vec![0u8; 100_000];
        one.broadcast(0, &mut got).expect("broadcast");
        sent.join().expect("no panic").expect("broadcast");
        assert!(got.iter().all(|&b| b == 7));
    });
}

/// Lanes left to the default: every rank of a job met through a rendezvous picks the same
/// count, a lane per core each has to itself (1 to 4; ranks in threads of one process share
/// its cores), and a collective runs on them byte for byte.
#[test]
fn ranks_left_to_the_default_agree_on_their_lanes() {
    const N: u32 = 3;
    let cpus = thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let want = (2 * cpus / N).clamp(1, 4) as u16;
    let port = free_tcp_port();
    let at = format!("127.0.0.1:{port}");
    let udp = free_udp_port();
    let lanes: Vec<u16> = thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|r| {
                let at = &at;
                s.spawn(move || {
                    let comm = Communicator::builder()
                        .rank(r)
                        .world_size(N)
                        .rendezvous(at)
                        .udp_port(udp)
                        .tcp_threshold(0)
                        .connect_timeout(Duration::from_secs(20))
                        .build()
                        .expect("build");
                    let mut buf = if r == 1 {
                        (0..300_000u32).map(|i| (i % 253) as u8).collect()
                    } else {
                        vec![0u8; 300_000]
                    };
                    comm.broadcast(1, &mut buf).expect("broadcast");
                    assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 253) as u8));
                    comm.lanes()
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert_eq!(lanes, vec![want; N as usize], "{cpus} cores");
}

#[test]
fn bad_arguments_and_settings_are_typed_errors() {
    let err = Communicator::builder()
        .world_size(2)
        .build()
        .expect_err("no rank");
    assert!(err.to_string().contains("RINGCAST_RANK"), "{err}");
    let err = Communicator::builder()
        .rank(0)
        .world_size(2)
        .build()
        .expect_err("no peers");
    assert!(err.to_string().contains("RINGCAST_BOOTSTRAP"), "{err}");

    // Settings no deadline can be computed from, or no datagram fits: typed errors naming
    // them, before anything is bound or connected.
    let one = || {
        Communicator::builder()
            .rank(0)
            .world_size(2)
            .rendezvous("127.0.0.1:1")
    };
    for (b, want) in [
        (one().peer_timeout(Duration::MAX), "RINGCAST_PEER_TIMEOUT"),
        (one().connect_timeout(Duration::MAX), "connect_timeout"),
        (one().startup_check(Duration::MAX), "RINGCAST_PROBE_WINDOW"),
        (one().cutoff_alpha(Duration::MAX), "cutoff_alpha"),
        (one().chunk_size(8), "RINGCAST_CHUNK_SIZE"),
        (
            one().rendezvous("127.0.0.1:notaport"),
            "CommBuilder::rendezvous",
        ),
        (one().rendezvous("127.0.0.1"), "CommBuilder::rendezvous"),
        (one().rendezvous(":99999"), "CommBuilder::rendezvous"),
        (one().rendezvous("fe80::1:80"), "CommBuilder::rendezvous"),
        (one().peer_timeout(Duration::ZERO), "RINGCAST_PEER_TIMEOUT"),
        (one().connect_timeout(Duration::ZERO), "connect_timeout"),
        (one().udp_port(0), "RINGCAST_PORT"),
        (one().lanes(65), "RINGCAST_LANES"),
        (
            Communicator::builder()
                .rank(0)
                .world_size(70_000)
                .rendezvous("127.0.0.1:1"),
            "world size",
        ),
    ] {
        match b.build() {
            Err(BuildError::Invalid { setting, .. }) if setting.contains(want) => {}
            other => panic!("{want}: {:?}", other.err()),
        }
    }

    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let comm = Communicator::builder()
        .rank(0)
        .world_size(1)
        .peer_table(vec![l.local_addr().expect("addr")], nonce(5))
        .control_listener(l)
        .udp_port(free_udp_port())
        .build()
        .expect("single rank");
    assert!(matches!(
        comm.ibroadcast(1, vec![0u8; 4]),
        Err(CommError::RootOutOfRange { root: 1, ranks: 1 })
    ));
    assert!(matches!(
        comm.iallgather(&[1u8, 2], vec![0u8; 3]),
        Err(CommError::BufferSize {
            what: "recv",
            got: 3,
            required: 2
        })
    ));
    assert!(matches!(
        comm.iallgatherv(&[1u8], vec![0u8; 1], &[1, 0]),
        Err(CommError::CountsLength { got: 2, ranks: 1 })
    ));
    assert!(matches!(
        comm.iallgatherv_in_place(vec![0u8; 2], &[1, 1]),
        Err(CommError::CountsLength { got: 2, ranks: 1 })
    ));
    assert!(matches!(
        comm.allgatherv_in_place(&mut [0u8; 2], &[2, 0]),
        Err(CommError::CountsLength { got: 2, ranks: 1 })
    ));
    assert!(matches!(
        comm.iallgatherv_in_place(vec![0u8; 2], &[3]),
        Err(CommError::BufferSize {
            what: "recv",
            got: 2,
            required: 3
        })
    ));
    // Counts whose bytes do not fit in memory: a typed error, not an overflow.
    assert!(matches!(
        comm.allgatherv::<u64>(&[], &mut [], &[usize::MAX / 4]),
        Err(CommError::CountsTooLarge)
    ));
    // Zero-sized elements carry no bytes: a typed error, not a panic or another length.
    assert!(matches!(
        comm.ibroadcast(0, vec![(); 3]),
        Err(CommError::ZeroSizedElements)
    ));
    assert!(matches!(
        comm.broadcast(0, &mut [(); 3]),
        Err(CommError::ZeroSizedElements)
    ));
    assert!(matches!(
        comm.iallgather_in_place(vec![(); usize::MAX]),
        Err(CommError::ZeroSizedElements)
    ));
    // The blocking Allgatherv counts the send buffer in elements, as its caller does.
    assert!(matches!(
        comm.allgatherv::<u32>(&[1, 2], &mut [0; 4], &[4]),
        Err(CommError::BufferSize {
            what: "send",
            got: 2,
            required: 4
        })
    ));
    // A single rank completes at once, and hands its buffer back.
    let mut v = [7u16; 9];
    comm.broadcast(0, &mut v).expect("broadcast");
    assert_eq!(v, [7u16; 9]);
    let mut out = [0i64; 3];
    comm.allgather(&[1i64, -2, 3], &mut out).expect("allgather");
    assert_eq!(out, [1, -2, 3]);
}

// ---- Multi-process: the child role, then the tests that spawn it. ----

const CHILD_ENV: &str = "RINGCAST_COMM_TEST_CHILD";

/// The child role: runs only when the parent set `RINGCAST_COMM_TEST_CHILD`; a no-op in a
/// normal test run.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Under `RUST_LOG`, a child prints the library's events to its stderr (the harness's).
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
    let code = match child(&role) {
        Ok(()) => 0,
        Err(msg) => {
            println!("@@ERR {msg}");
            1
        }
    };
    std::process::exit(code);
}

fn child(role: &str) -> Result<(), String> {
    if role == "file-limit" {
        // Run under a hard limit of 48 open files: 64 ranks need more before anyone is met.
        return match Communicator::from_env() {
            Err(err @ ringcast::BuildError::FileLimit { .. }) => {
                println!("@@FILELIMIT {err}");
                Ok(())
            }
            Err(other) => Err(format!("another error: {other}")),
            Ok(_) => Err("built under a 48-file limit".into()),
        };
    }
    let comm = Communicator::from_env().map_err(|e| format!("from_env: {e}"))?;
    let me = comm.rank();
    let n = comm.size();
    // libtest may have started a line: reports are found by their "@@" mark.
    let say = |s: &str| println!("@@{s}");
    match role {
        "collectives" => {
            broadcast_checked(&comm, "broadcast", 20, 2, (1 << 20) + 77)?;
            let blocks: Vec<Vec<u8>> = (0..n).map(|r| pattern(21, r, 100_000)).collect();
            let mut recv = vec![0u8; 100_000 * n as usize];
            comm.allgather(&blocks[me as usize], &mut recv).map_err(e)?;
            check("allgather", &recv, &blocks.concat())?;
            // Halves split from a communicator that met through the rendezvous, each
            // broadcasting from its first rank, beside an Allgather on a copy of the whole.
            let sp = |x: ringcast::SplitError| format!("split: {x}");
            let half = comm.split(Some(me % 2), me).map_err(sp)?.ok_or("no half")?;
            let whole = comm.dup().map_err(sp)?;
            // The processes' entries carry this kernel's id: one host, all of them.
            let node = comm.split_by_host(me).map_err(sp)?;
            if (node.rank(), node.size()) != (me, n) {
                return Err(format!("host part is {} of {}", node.rank(), node.size()));
            }
            let on_whole = whole
                .iallgather(&blocks[me as usize], vec![0u8; recv.len()])
                .map_err(e)?;
            broadcast_checked(
                &half,
                "a half's broadcast",
                24 + u64::from(me % 2),
                0,
                300_000,
            )?;
            check(
                "the copy's allgather",
                &on_whole.wait().map_err(e)?,
                &blocks.concat(),
            )?;
            say("OK");
            Ok(())
        }
        "victim" | "victim-small" | "victim-chain" | "victim-ring" => {
            let mut x = [0u8; 8];
            comm.broadcast(0, &mut x).map_err(e)?;
            let victim = victim_of(role, n);
            if me == victim {
                // Stops short of the collective the others are in, and waits to be killed.
                say("POSTED");
                thread::sleep(Duration::from_secs(120));
                return Err("not killed".into());
            }
            // Over TCP: a 4 KiB-per-rank Allgather down the trees, an 8 MiB Broadcast down the
            // chain, a 1 MiB-per-rank Allgather around the ring. Every survivor needs what the
            // victim holds or passes on, most of them through another rank.
            let block = match role {
                "victim-small" => 4096,
                "victim-ring" => 1 << 20,
                _ => 0,
            };
            let req = if block == 0 {
                let len = 8 << 20;
                let buf = if me == 0 {
                    pattern(22, 0, len)
                } else {
                    vec![0; len]
                };
                comm.ibroadcast(0, buf)
            } else {
                comm.iallgather(&pattern(23, me, block), vec![0u8; block * n as usize])
            }
            .map_err(e)?;
            say("POSTED");
            match req.wait() {
                Err(err) => {
                    say(&format!("FAILED peer={:?} {err}", err.peer()));
                    Ok(())
                }
                // The chain's root only sends: it is done once its pieces are queued.
                Ok(_) if role == "victim-chain" && me == 0 => {
                    say("SENT");
                    Ok(())
                }
                Ok(_) => Err("completed without the victim".into()),
            }
        }
        other => Err(format!("unknown role {other}")),
    }
}

/// The rank a `victim` role stops or kills: the last one, or for the chain (from rank 0) the
/// second, so that two ranks wait behind it.
fn victim_of(role: &str, n: u32) -> u32 {
    if role == "victim-chain" { 1 } else { n - 1 }
}

/// A process whose hard limit on open files cannot hold a connection to every peer gets a
/// typed error that says what to raise, at once, instead of a failed accept midway through
/// the mesh.
#[test]
fn too_few_open_files_is_a_clear_error() {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 48 && exec \"$0\" --exact child_role --nocapture --test-threads=1")
        .arg(&exe)
        .env(CHILD_ENV, "file-limit")
        .env("RINGCAST_RANK", "0")
        .env("RINGCAST_WORLD_SIZE", "64")
        .env(
            "RINGCAST_BOOTSTRAP",
            format!("127.0.0.1:{}", free_tcp_port()),
        )
        .env_remove("RINGCAST_TCP_THRESHOLD")
        .env_remove("RINGCAST_LANES")
        .env_remove("RINGCAST_CHAINS")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("@@FILELIMIT ").map(|(_, m)| m.to_owned()))
        .unwrap_or_else(|| panic!("no FILELIMIT report: {stdout}"));
    assert!(out.status.success(), "{stdout}");
    for want in [
        "64 ranks",
        "2 TCP meshes of 63",
        "may open 48",
        // 63 x 2 connections, 2 sockets for each of the up to 4 lanes the default picks, 64.
        "ulimit -n 198",
        "RINGCAST_TCP_THRESHOLD=0",
    ] {
        assert!(line.contains(want), "{want:?} not in {line}");
    }
}

/// Kills the children it holds when dropped: a failed test leaves no process behind.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `RANKS` children in `role`; returns them and a channel of `(rank, line)`.
fn spawn_children(role: &str, peer_timeout_s: u32) -> (Children, mpsc::Receiver<(u32, String)>) {
    let exe = std::env::current_exe().expect("test binary");
    let bootstrap = format!("127.0.0.1:{}", free_tcp_port());
    let port = free_udp_port().to_string();
    let (tx, rx) = mpsc::channel();
    let mut kids = Children(Vec::new());
    for r in 0..RANKS {
        let mut child = Command::new(&exe)
            .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role)
            .env("RINGCAST_RANK", r.to_string())
            .env("RINGCAST_WORLD_SIZE", RANKS.to_string())
            .env("RINGCAST_BOOTSTRAP", &bootstrap)
            .env("RINGCAST_PORT", &port)
            .env("RINGCAST_LANES", "2")
            // The "-small" roles run their collectives over TCP (the default threshold), the
            // "-chain" and "-ring" ones too (a threshold above their 8 MiB).
            .env(
                "RINGCAST_TCP_THRESHOLD",
                if role.ends_with("-small") {
                    "65536"
                } else if role.ends_with("-chain") || role.ends_with("-ring") {
                    "16777216"
                } else {
                    "0"
                },
            )
            .env("RINGCAST_PEER_TIMEOUT", peer_timeout_s.to_string())
            .env("RINGCAST_PROBE_WINDOW", "6")
            .env("RINGCAST_BOOTSTRAP_TIMEOUT", "30")
            .env_remove("RINGCAST_IFNAME")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().expect("stdout");
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, line));
            }
        });
        kids.0.push(child);
    }
    (kids, rx)
}

/// Waits for a report from every rank in `ranks`; panics on an `ERR` report.
fn expect_lines(
    rx: &mpsc::Receiver<(u32, String)>,
    ranks: &[u32],
    deadline: Instant,
) -> Vec<(u32, String)> {
    let mut got: Vec<(u32, String)> = Vec::new();
    while ranks.iter().any(|r| !got.iter().any(|(g, _)| g == r)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((r, line)) => {
                let Some(at) = line.find("@@") else {
                    continue;
                };
                let report = line[at + 2..].to_owned();
                if report.starts_with("ERR") {
                    panic!("rank {r}: {report}");
                }
                if ranks.contains(&r) {
                    got.push((r, report));
                }
            }
            Err(_) => panic!("no answer from some of {ranks:?} in time; got {got:?}"),
        }
    }
    got
}

fn wait_exit(kids: &mut Children, ranks: &[u32], deadline: Instant) {
    for &r in ranks {
        let c = &mut kids.0[r as usize];
        loop {
            match c.try_wait().expect("try_wait") {
                Some(st) => {
                    assert!(st.success(), "rank {r} exited with {st}");
                    break;
                }
                None if Instant::now() > deadline => panic!("rank {r} did not exit in time"),
                None => thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

#[test]
fn processes_bootstrap_from_env_and_run_collectives() {
    let deadline = Instant::now() + DEADLINE;
    let (mut kids, rx) = spawn_children("collectives", 10);
    let all: Vec<u32> = (0..RANKS).collect();
    expect_lines(&rx, &all, deadline);
    wait_exit(&mut kids, &all, deadline);
}

#[test]
fn a_killed_process_fails_the_others_naming_it() {
    killed_rank_is_named("victim");
}

#[test]
fn a_hung_process_fails_the_others_naming_it() {
    hung_rank_is_named("victim");
}

/// The same over the TCP trees of small operations: a killed rank's connections close.
#[test]
fn a_killed_process_fails_small_operations_naming_it() {
    killed_rank_is_named("victim-small");
}

/// A hung rank over the TCP trees: its connections stay open, and a rank that gets its block
/// through another rank must still name the hung one, not the rank in between.
#[test]
fn a_hung_process_fails_small_operations_naming_it() {
    hung_rank_is_named("victim-small");
}

/// The same down the TCP chain and around the TCP ring (large operations over TCP): the ranks
/// further along wait longer, so the one right after the hung rank names it first.
#[test]
fn a_hung_process_fails_tcp_chains_and_rings_naming_it() {
    hung_rank_is_named("victim-chain");
    hung_rank_is_named("victim-ring");
}

/// The last rank, killed while the others wait in `role`'s collective, is named by each.
fn killed_rank_is_named(role: &str) {
    let deadline = Instant::now() + DEADLINE;
    let (mut kids, rx) = spawn_children(role, 10);
    let all: Vec<u32> = (0..RANKS).collect();
    expect_lines(&rx, &all, deadline);
    let victim = RANKS - 1;
    kids.0[victim as usize].kill().expect("SIGKILL");
    survivors_name(&mut kids, &rx, victim, true, deadline);
}

/// The last rank, stopped (SIGSTOP) while the others wait in `role`'s collective, is named by
/// each. A short peer timeout: the hung rank keeps its connections open, so only the timeout
/// can tell.
fn hung_rank_is_named(role: &str) {
    let deadline = Instant::now() + DEADLINE;
    let (mut kids, rx) = spawn_children(role, 2);
    let all: Vec<u32> = (0..RANKS).collect();
    expect_lines(&rx, &all, deadline);
    let victim = victim_of(role, RANKS);
    let pid = kids.0[victim as usize].id().to_string();
    let stopped = Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("kill -STOP");
    assert!(stopped.success(), "kill -STOP {pid}");
    // `Children` kills it (SIGKILL works on a stopped process) when the test ends.
    survivors_name(&mut kids, &rx, victim, false, deadline);
}

/// Every rank but `victim` reports a failure naming it (a chain's root: that it sent), and
/// exits cleanly.
fn survivors_name(
    kids: &mut Children,
    rx: &mpsc::Receiver<(u32, String)>,
    victim: u32,
    killed: bool,
    deadline: Instant,
) {
    let survivors: Vec<u32> = (0..RANKS).filter(|&r| r != victim).collect();
    let lines = expect_lines(rx, &survivors, deadline);
    for (r, line) in lines {
        if line == "SENT" {
            continue;
        }
        // A killed rank's connections close: nobody should have to wait for the timeout.
        assert!(
            !(killed && line.contains("(peer timeout)")),
            "rank {r}: {line}"
        );
        assert!(
            line.starts_with(&format!("FAILED peer=Some({victim})")),
            "rank {r}: {line}"
        );
    }
    wait_exit(kids, &survivors, deadline);
}

/// What a rank expects of an operation its ranks disagree on: a mismatch between one of the
/// pairs `(peer, reported_by)` in `pairs`, or (`may_complete`) the right bytes for what this
/// rank posted.
fn disagreed<T: PartialEq>(
    name: &str,
    got: Result<Vec<T>, CommError>,
    want: &[T],
    pairs: &[(u32, u32)],
    may_complete: bool,
) -> Result<(), String> {
    match got {
        Err(CommError::ShapeMismatch { peer, reported_by })
            if pairs.contains(&(peer, reported_by)) =>
        {
            Ok(())
        }
        Ok(v) if may_complete && v == want => Ok(()),
        Ok(_) if may_complete => Err(format!("{name}: completed with other bytes")),
        other => Err(format!(
            "{name}: {:?}, not a mismatch (rank, reported by) among {pairs:?}",
            other.map(|v| v.len())
        )),
    }
}

/// An erroneous program over multicast: ranks that post an operation with another length,
/// root or kind. The barrier's hub (or the rank a stray `Ready` reaches) sees it before any
/// data moves, and every rank fails the operation naming the odd rank, long before the peer
/// timeout (a minute here: a failure by the deadline would name no mismatch, and the test's
/// own 90-second deadline would end it). The ranks stay in step: the next operation completes.
#[test]
fn ranks_that_disagree_on_an_operation_fail_it_at_once_and_go_on() {
    let all = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        12,
        |b| b.tcp_threshold(0).peer_timeout(Duration::from_secs(60)),
        move |comm| {
            let me = comm.rank();
            let post = |root: u32, len: usize| {
                let buf = if me == root {
                    pattern(90, root, len)
                } else {
                    vec![0; len]
                };
                comm.ibroadcast(root, buf).map_err(e)
            };
            // Rank 2 posts twice the length: the hub, rank 0, compares.
            let len = if me == 2 { 2 << 20 } else { 1 << 20 };
            let got = post(0, len)?.wait();
            disagreed("length", got, &[], &[(2, 0)], false)?;
            // Rank 3 takes rank 1 for the root: its `Ready` reaches rank 1, no hub.
            let got = post(if me == 3 { 1 } else { 0 }, 1 << 20)?.wait();
            disagreed("root", got, &[], &[(3, 1)], false)?;
            // Rank 1 posts an Allgather where the others broadcast from rank 0.
            let got = if me == 1 {
                comm.iallgather(&[1u8; 1 << 18], vec![0; 1 << 20])
                    .map_err(e)?
                    .wait()
            } else {
                post(0, 1 << 20)?.wait()
            };
            disagreed("kind", got, &[], &[(1, 0)], false)?;
            // Rank 1 takes itself for the root: it expects every `Ready` and sends none, but
            // as a hub other than rank 0 it sends rank 0 its witness.
            let got = post(if me == 1 { 1 } else { 0 }, 1 << 20)?.wait();
            disagreed("self-root", got, &[], &[(1, 0)], false)?;
            // Rank 2 posts nothing: it completes at once, but its `Ready` reaches the hub.
            let got = post(0, if me == 2 { 0 } else { 1 << 20 })?.wait();
            disagreed("empty", got, &[], &[(2, 0)], me == 2)?;
            broadcast_checked(&comm, "after", 91, 3, 1 << 20)?;
            all.wait();
            Ok(())
        },
    );
}

/// The same over the TCP trees and chains (small operations), where the pieces and the
/// chain's clear-to-send carry the fingerprint: the rank that receives one of another shape
/// fails the operation and tells every rank. Ranks upstream of it may already have
/// completed, with their bytes.
#[test]
fn ranks_that_disagree_on_a_tcp_operation_fail_it_at_once_and_go_on() {
    let all = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        13,
        |b| {
            b.tcp_threshold(4 << 20)
                .peer_timeout(Duration::from_secs(60))
        },
        move |comm| {
            let me = comm.rank();
            // 1 MiB Broadcasts go down the chain 0 -> 1 -> 2 -> 3, each rank clearing its
            // left neighbour to send and showing its right neighbour its shape. Rank 2 posts
            // twice the length: ranks 1 and 3 see its shape, it sees theirs, whichever comes
            // first; rank 0 completes (rank 1 cleared it).
            let len = if me == 2 { 2 << 20 } else { 1 << 20 };
            let want = pattern(92, 0, len);
            let buf = if me == 0 { want.clone() } else { vec![0; len] };
            let got = comm.ibroadcast(0, buf).map_err(e)?.wait();
            let pairs = [(2, 1), (3, 2), (1, 2), (2, 3)];
            disagreed("length", got, &want, &pairs, me == 0)?;
            // Rank 1 posts an Allgather (of blocks that fit a piece: trees, sent at once):
            // its block reaches ranks 2 and 3 (down its tree), rank 0's shape and rank 2's
            // clear-to-send reach it, whichever comes first.
            let kind = [(1, 2), (1, 3), (2, 1), (0, 1)];
            let got = if me == 1 {
                comm.iallgather(&[1u8; 1 << 18], vec![0; 1 << 20])
                    .map_err(e)?
                    .wait()
            } else {
                let want = pattern(93, 0, 1 << 20);
                let buf = if me == 0 {
                    want.clone()
                } else {
                    vec![0; 1 << 20]
                };
                let got = comm.ibroadcast(0, buf).map_err(e)?.wait();
                disagreed("kind", got, &want, &kind, false)?;
                Ok(Vec::new())
            };
            if me == 1 {
                disagreed("kind", got, &[], &kind, false)?;
            }
            // Rank 0 broadcasts nothing where the others expect 1000 bytes: its children in the
            // tree (ranks 1 and 2) see its empty piece, rank 3 hears from rank 2.
            let len = if me == 0 { 0 } else { 1000 };
            let got = comm.ibroadcast(0, vec![0u8; len]).map_err(e)?.wait();
            disagreed("empty", got, &[], &[(0, 1), (0, 2)], me == 0)?;
            // Only the root posts more than a piece (a chain, waiting for a clear-to-send);
            // the others post a tree's length and send none. The root shows rank 1 its
            // shape, which rank 1 refuses.
            let len = if me == 0 { 1 << 20 } else { 100_000 };
            let got = comm.ibroadcast(0, vec![0u8; len]).map_err(e)?.wait();
            disagreed("root alone", got, &[], &[(0, 1)], false)?;
            // An Allgatherv whose block 2 is empty at rank 2 only: rank 2 sends nothing of
            // it, but it takes and passes on the other blocks (down their trees, with blocks
            // of one piece; around the ring with larger ones, clearing its left neighbour),
            // so a rank next to it sees its shape.
            for (name, block) in [("empty block, trees", 1000), ("empty block, ring", 300_000)] {
                let mut counts = vec![block; RANKS as usize];
                if me == 2 {
                    counts[2] = 0;
                }
                let mine = vec![me as u8 + 1; counts[me as usize]];
                let total = counts.iter().sum();
                let got = comm
                    .iallgatherv(&mine, vec![0u8; total], &counts)
                    .map_err(e)?
                    .wait();
                let pairs: Vec<(u32, u32)> = (0..RANKS)
                    .filter(|&r| r != 2)
                    .flat_map(|r| [(r, 2), (2, r)])
                    .collect();
                disagreed(name, got, &[], &pairs, false)?;
            }
            broadcast_checked(&comm, "after", 94, 3, 1 << 20)?;
            all.wait();
            Ok(())
        },
    );
}

/// Across the threshold with no message crossing: rank 3 posts 4 KiB (over TCP, a leaf of
/// the tree waiting on its parent) where the others post 1 MiB (over multicast, rank 3's
/// engine skipping its id). The barrier's question finds rank 3's engine past the
/// operation without it (ranks 0-2 fail it as a `ShapeMismatch` naming rank 3), and rank 3's
/// question finds its parent running it over multicast (a `ShapeMismatch` naming the
/// parent), each within a few peer timeouts: none waits for the post timeout, as for a late
/// rank, nor names a live rank as hung. The next operation runs everywhere.
#[test]
fn ranks_that_ran_an_operation_on_different_paths_find_out_when_they_ask() {
    let all = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        67,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_secs(1))
        },
        move |comm| {
            let me = comm.rank();
            let len = if me == 3 { 4096 } else { 1 << 20 };
            let got = comm.ibroadcast(0, vec![0u8; len]).map_err(e)?.wait();
            match (me, got) {
                (0..=2, Err(CommError::ShapeMismatch { peer: 3, .. })) => {}
                (3, Err(CommError::ShapeMismatch { peer, .. })) if peer != 3 => {}
                (_, other) => return Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
            broadcast_checked(&comm, "after", 98, 2, 1 << 20)?;
            all.wait();
            Ok(())
        },
    );
}

/// Over TCP, ranks that disagree on the root where no piece crosses: rank 0 takes rank 1 for
/// the root of a small Broadcast (a tree) where the others take rank 0. Rank 0 waits on its
/// parent in rank 1's tree, the others on rank 0 or below it; nobody sends anything. The
/// ranks whose wait runs out ask the peer they wait on where it stands, and its answer
/// carries its fingerprint of the operation: it differs, and every rank fails it as a
/// `ShapeMismatch` within a few peer timeouts (not as a hang, nor at the post timeout as if
/// a rank were late). The next operation runs everywhere.
#[test]
fn ranks_that_disagree_on_the_root_over_tcp_find_out_when_they_ask() {
    let all = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        68,
        |b| b.peer_timeout(Duration::from_secs(1)),
        move |comm| {
            let me = comm.rank();
            let root = if me == 0 { 1 } else { 0 };
            let got = comm
                .ibroadcast(root, vec![me as u8; 4096])
                .map_err(e)?
                .wait();
            match got {
                Err(CommError::ShapeMismatch { .. }) => {}
                other => return Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
            broadcast_checked(&comm, "after", 99, 1, 4096)?;
            all.wait();
            Ok(())
        },
    );
}

/// A rank that posts past the post timeout, over multicast: the others fail the operation
/// naming it and tell it (it answers: it is alive), so its own operation fails as it posts
/// it, naming it as the rank given up on. Untold, a leaf asked the hub, heard that the hub had
/// ended the operation, and asked again until its peers left; a late root went on to multicast
/// to ranks that had dropped the operation, and named a live one as unresponsive. For a leaf
/// (rank 2) and for the root and hub (rank 0); the others stay until the late rank is done.
#[test]
fn a_rank_that_posts_past_the_post_timeout_fails_naming_itself() {
    for (salt, late) in [(69, 2u32), (70, 0)] {
        let done = Arc::new(Barrier::new(RANKS as usize));
        world_with(
            salt,
            |b| {
                b.tcp_threshold(0)
                    .peer_timeout(Duration::from_secs(1))
                    .post_timeout(Duration::from_secs(2))
            },
            move |comm| {
                let me = comm.rank();
                if me == late {
                    thread::sleep(Duration::from_secs(4));
                }
                let mut buf = vec![me as u8; 1 << 20];
                let got = comm.broadcast(0, &mut buf);
                done.wait();
                match got {
                    Err(CommError::PeerFailed { peer, .. }) if me == late && peer == late => Ok(()),
                    Err(err) if me != late && err.peer() == Some(late) => Ok(()),
                    other => Err(format!("rank {me} (late: {late}): {other:?}")),
                }
            },
        );
    }
}

/// Over TCP, an old failure report does not make a late rank's peers blame the rank it named
/// (a TCP report outlives the multicast operations completed since). Op 0 (a small
/// Broadcast from rank 0, over TCP): rank 2 posts it past the post timeout, so rank 3 (its
/// child) gives up with `NotPosted{2}` and reports it. Two large Broadcasts then complete over
/// multicast everywhere, rank 2 included. Op 3 (a small Allgather, over TCP): rank 3 is late
/// by three peer timeouts, within the post timeout: it is waited for, and the Allgather
/// completes everywhere (it failed at once naming rank 2, found by an audit).
#[test]
fn a_stale_tcp_report_does_not_blame_a_rank_that_went_on() {
    let sync = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        91,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_millis(500))
                .post_timeout(Duration::from_secs(2))
        },
        move |comm| {
            let me = comm.rank();
            if me == 2 {
                thread::sleep(Duration::from_secs(3));
            }
            let mut small = vec![me as u8; 4096];
            let first = comm.broadcast(0, &mut small);
            sync.wait();
            let first_ok = matches!(
                (me, &first),
                (0 | 1, Ok(_))
                    | (3, Err(CommError::NotPosted { peer: 2 }))
                    | (2, Err(CommError::PeerFailed { peer: 2, .. }))
            );
            if !first_ok {
                return Err(format!("rank {me}: op 0 {first:?}"));
            }
            for _ in 0..2 {
                let mut big = vec![me as u8; 1 << 20];
                comm.broadcast(1, &mut big).map_err(e)?;
                if big.iter().any(|&b| b != 1) {
                    return Err(format!("rank {me}: wrong multicast bytes"));
                }
            }
            sync.wait();
            if me == 3 {
                thread::sleep(Duration::from_millis(1500));
            }
            let mut all = vec![0u8; 4096];
            let got = comm.allgather(&[me as u8; 1024], &mut all);
            sync.wait();
            got.map(|_| ()).map_err(|err| {
                format!("rank {me}: op 3 (rank 3 late, within the post timeout): {err:?}")
            })
        },
    );
}

/// Late ranks over TCP: a small Allgather (Bruck, 4 ranks) that rank 3 never posts, and that
/// ranks 1 and 2 (the two waiting on rank 3 directly: rounds 1 and 0) post 3 s late, within
/// the 4 s post timeout. Rank 0 waits on rank 2 (round 1): late, then running. It once blamed
/// it at its own start plus the post timeout and the longest wait, before the post timeouts
/// of ranks 1 and 2 (from their later starts) named rank 3; now it counts from when it saw
/// rank 2 posted. Every rank names rank 3 (found by an audit).
#[test]
fn a_rank_that_posted_late_is_not_blamed_for_a_rank_that_never_posts() {
    let release = Arc::new(Barrier::new(RANKS as usize));
    world_with(
        92,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_millis(500))
                .post_timeout(Duration::from_secs(4))
        },
        move |comm| {
            let me = comm.rank();
            let out = if me == 3 {
                Ok(())
            } else {
                if me == 1 || me == 2 {
                    thread::sleep(Duration::from_secs(3));
                }
                match comm.allgather(&[me as u8; 1024], &mut [0u8; 4096]) {
                    Err(err) if err.peer() == Some(3) => Ok(()),
                    other => Err(format!("rank {me}: {other:?}")),
                }
            };
            release.wait();
            out
        },
    );
}

/// Over TCP, a rank that disagrees on an operation and leaves before any piece shows it: rank
/// 2 posts a small Broadcast empty (it completes at once) and drops its communicator; the
/// root posts a second later. Rank 3, below rank 2 in the tree, waits for a piece that rank 2
/// will never send: once rank 2's goodbye (which says it finished the operation) is read, it
/// fails at once naming rank 2, and does not wait out its (one-minute) peer timeout.
#[test]
fn a_wait_on_a_rank_that_left_fails_at_once() {
    world_with(
        71,
        |b| {
            b.tcp_threshold(64 << 10)
                .peer_timeout(Duration::from_secs(60))
        },
        |comm| {
            let me = comm.rank();
            match me {
                2 => thread::sleep(Duration::from_millis(200)),
                0 => thread::sleep(Duration::from_secs(1)),
                _ => {}
            }
            let len = if me == 2 { 0 } else { 1000 };
            let got = comm.ibroadcast(0, vec![me as u8; len]).map_err(e)?.wait();
            match (me, got) {
                (2, Ok(v)) if v.is_empty() => Ok(()),
                (3, Err(err)) if err.peer() == Some(2) => Ok(()),
                (0 | 1, Ok(v)) if v == vec![0u8; 1000] => Ok(()),
                (0 | 1, Err(err)) if err.peer() == Some(2) => Ok(()),
                (_, other) => Err(format!("rank {me}: {:?}", other.map(|v| v.len()))),
            }
        },
    );
}
