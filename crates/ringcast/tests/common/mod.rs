//! Helpers the Communicator test binaries share: ports, nonces, data patterns, checks.
// Each test binary uses its own subset.
#![allow(dead_code)]

use ringcast::bootstrap::{PortKind, free_local_port};
use ringcast::comm::{CommBuilder, OpStats};
use ringcast::{BuildError, CommError, Communicator};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// `n` control listeners on loopback, and their addresses: a peer table.
pub(crate) fn control_listeners(n: u32) -> (Vec<TcpListener>, Vec<std::net::SocketAddr>) {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind control"))
        .collect();
    let table = listeners
        .iter()
        .map(|l| l.local_addr().expect("addr"))
        .collect();
    (listeners, table)
}

/// What finishes a rank's builder in [`thread_world`]: `(rank, builder, udp_port)`.
pub(crate) trait Setup:
    Fn(u32, CommBuilder, u16) -> CommBuilder + Send + Sync + Clone + 'static
{
}
impl<F: Fn(u32, CommBuilder, u16) -> CommBuilder + Send + Sync + Clone + 'static> Setup for F {}

/// What a rank of [`thread_world`] runs on its build's result.
pub(crate) trait RankFn<R>:
    Fn(u32, Result<Communicator, BuildError>) -> Result<R, String> + Send + Sync + Clone + 'static
{
}
impl<R, F> RankFn<R> for F where
    F: Fn(u32, Result<Communicator, BuildError>) -> Result<R, String>
        + Send
        + Sync
        + Clone
        + 'static
{
}

/// Builds `ranks` communicators, each on a thread of its own, runs `f` on each build's
/// result, and returns what the ranks return, in rank order. Every rank starts from one
/// builder (an explicit peer table of fresh control listeners, a nonce drawn from `salt`,
/// loopback multicast on a fresh UDP port, 2 lanes, a 10 s peer timeout, 100 Mbit/s, a 20 ms
/// cutoff), which `setup(rank, builder, udp_port)` finishes. Panics with every rank's error,
/// or at `deadline` with those so far: a test fails, never hangs.
pub(crate) fn thread_world<R: Send + 'static>(
    ranks: u32,
    salt: u64,
    deadline: Duration,
    setup: impl Setup,
    f: impl RankFn<R>,
) -> Vec<R> {
    let nonce = nonce(salt);
    let port = free_udp_port();
    let (listeners, table) = control_listeners(ranks);
    let (tx, rx) = mpsc::channel();
    for (r, l) in (0..ranks).zip(listeners) {
        let (table, tx, f, setup) = (table.clone(), tx.clone(), f.clone(), setup.clone());
        thread::Builder::new()
            .name(format!("test-rank{r}"))
            .spawn(move || {
                let b = Communicator::builder()
                    .rank(r)
                    .world_size(ranks)
                    .peer_table(table, nonce)
                    .control_listener(l)
                    .interface(Ipv4Addr::LOCALHOST)
                    .udp_port(port)
                    .lanes(2)
                    .peer_timeout(Duration::from_secs(10))
                    .link_bandwidth(100_000_000)
                    .cutoff_alpha(Duration::from_millis(20));
                let out = f(r, setup(r, b, port).build());
                let _ = tx.send((r, out));
            })
            .expect("spawn");
    }
    drop(tx);
    let end = Instant::now() + deadline;
    let mut out: Vec<Option<R>> = (0..ranks).map(|_| None).collect();
    let mut errors = Vec::new();
    for _ in 0..ranks {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((r, Ok(v))) => out[r as usize] = Some(v),
            Ok((r, Err(e))) => errors.push(format!("rank {r}: {e}")),
            Err(_) => panic!("ranks did not finish within {deadline:?}: {errors:?}"),
        }
    }
    assert!(errors.is_empty(), "{errors:#?}");
    out.into_iter()
        .map(|v| v.expect("every rank reported"))
        .collect()
}

/// A UDP port nobody holds now, below the kernel's ephemeral range (as the `ringcast` tool's
/// local runs pick theirs).
pub(crate) fn free_udp_port() -> u16 {
    free_local_port(PortKind::Udp).expect("a free UDP port")
}

/// A TCP port nobody holds now, for a rendezvous bound a moment later: below the kernel's
/// ephemeral range, where no outgoing connection (another test's) can be given it meanwhile.
pub(crate) fn free_tcp_port() -> u16 {
    free_local_port(PortKind::Tcp).expect("a free TCP port")
}

/// One splitmix64 step (the core's).
pub(crate) use ringcast::core::port::splitmix64 as splitmix;

/// A job nonce no other test run draws.
pub(crate) fn nonce(salt: u64) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    splitmix(t ^ (u64::from(std::process::id()) << 32) ^ salt)
}

/// Rank `r`'s data for operation `salt`: differs per 256-byte step, so a chunk at the wrong
/// offset is caught.
pub(crate) fn pattern(salt: u64, r: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (splitmix(salt ^ (u64::from(r) << 40) ^ (i as u64 >> 8)) as u8) ^ (i as u8))
        .collect()
}

/// `got` equals `want`, or where they first differ.
pub(crate) fn check<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[T],
    want: &[T],
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {:?}, want {:?}",
            got[i], want[i]
        )),
    }
}

/// A Broadcast from `root` of `pattern(salt, root, len)`, checked byte for byte on every rank
/// (`what` names it in an error); its stats.
pub(crate) fn broadcast_checked(
    comm: &Communicator,
    what: &str,
    salt: u64,
    root: u32,
    len: usize,
) -> Result<OpStats, String> {
    let want = pattern(salt, root, len);
    let mut buf = broadcast_buffer(comm, root, &want);
    let st = comm.broadcast(root, &mut buf).map_err(e)?;
    check(what, &buf, &want)?;
    Ok(st)
}

/// This rank's buffer for a Broadcast of `data` from `root`: the data at the root, zeros
/// elsewhere.
pub(crate) fn broadcast_buffer(comm: &Communicator, root: u32, data: &[u8]) -> Vec<u8> {
    if comm.rank() == root {
        data.to_vec()
    } else {
        vec![0; data.len()]
    }
}

/// Posts a Broadcast of `data` from `root` ([`broadcast_buffer`]).
pub(crate) fn ibroadcast_of(
    comm: &Communicator,
    root: u32,
    data: &[u8],
) -> Result<ringcast::Request<u8>, String> {
    comm.ibroadcast(root, broadcast_buffer(comm, root, data))
        .map_err(e)
}

/// An error as the tests report it.
pub(crate) fn e(x: CommError) -> String {
    x.to_string()
}

/// How many operations [`random_ops`] runs: `RINGCAST_SOAK_OPS`, 300 by default.
pub(crate) fn soak_ops() -> u64 {
    std::env::var("RINGCAST_SOAK_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// `ops` operations of a random mix drawn from `seed` (the same on every rank): Broadcasts
/// from any root, Allgathers and Allgathervs (zero-sized blocks included), from 0 bytes to
/// 1 MiB; posted a few at a time without waiting and waited in a random order, or run
/// blocking. Every result is checked byte for byte.
pub(crate) fn random_ops(comm: &Communicator, seed: u64, ops: u64) -> Result<(), String> {
    let me = comm.rank();
    let ranks = comm.size();
    let mut rng = seed;
    let mut next = move |n: u64| {
        rng = splitmix(rng);
        rng % n.max(1)
    };
    // Mostly small sizes, log-uniform up to 1 MiB, sometimes empty.
    let size = |next: &mut dyn FnMut(u64) -> u64| -> usize {
        if next(16) == 0 {
            return 0;
        }
        let e = next(20);
        ((1u64 << e) + next(1 << e)) as usize
    };
    let mut done = 0;
    while done < ops {
        let batch = 1 + next(5).min(ops - done - 1);
        let blocking = next(4) == 0;
        let mut reqs: Vec<(ringcast::Request<u8>, Vec<u8>, String)> = Vec::new();
        for i in 0..batch {
            let salt = seed ^ (done + i) << 8;
            match next(3) {
                0 => {
                    let root = next(u64::from(ranks)) as u32;
                    let data = pattern(salt, root, size(&mut next));
                    let what = format!("op {}: broadcast of {} from {root}", done + i, data.len());
                    if blocking {
                        let mut buf = broadcast_buffer(comm, root, &data);
                        comm.broadcast(root, &mut buf)
                            .map_err(|x| format!("{what}: {x}"))?;
                        check(&what, &buf, &data)?;
                    } else {
                        reqs.push((ibroadcast_of(comm, root, &data)?, data, what));
                    }
                }
                kind => {
                    let counts: Vec<usize> = if kind == 1 {
                        vec![size(&mut next) / 4; ranks as usize]
                    } else {
                        (0..ranks).map(|_| size(&mut next) / 4).collect()
                    };
                    let blocks: Vec<Vec<u8>> = (0..ranks)
                        .map(|r| pattern(salt, r, counts[r as usize]))
                        .collect();
                    let want = blocks.concat();
                    let mine = &blocks[me as usize];
                    // A third of them in place (`MPI_IN_PLACE`), chosen per rank apart from
                    // the shared stream (ranks may differ: it is local): the rest of the
                    // buffer is garbage the operation must overwrite.
                    let in_place = splitmix(salt ^ u64::from(me)).is_multiple_of(3);
                    let what = format!(
                        "op {}: allgather(v) of {counts:?}{}",
                        done + i,
                        if in_place { " in place" } else { "" }
                    );
                    let mut recv = vec![0; want.len()];
                    if in_place {
                        recv.fill(0xE5);
                        let at: usize = counts[..me as usize].iter().sum();
                        recv[at..at + mine.len()].copy_from_slice(mine);
                    }
                    if blocking {
                        let done = match (in_place, kind == 1) {
                            (true, true) => comm.allgather_in_place(&mut recv),
                            (true, false) => comm.allgatherv_in_place(&mut recv, &counts),
                            (false, true) => comm.allgather(mine, &mut recv),
                            (false, false) => comm.allgatherv(mine, &mut recv, &counts),
                        };
                        done.map_err(|x| format!("{what}: {x}"))?;
                        check(&what, &recv, &want)?;
                    } else {
                        let req = match (in_place, kind == 1) {
                            (true, true) => comm.iallgather_in_place(recv),
                            (true, false) => comm.iallgatherv_in_place(recv, &counts),
                            (false, true) => comm.iallgather(mine, recv),
                            (false, false) => comm.iallgatherv(mine, recv, &counts),
                        };
                        reqs.push((req.map_err(e)?, want, what));
                    }
                }
            }
        }
        while !reqs.is_empty() {
            let i = next(reqs.len() as u64) as usize;
            let (req, want, what) = reqs.swap_remove(i);
            let got = req.wait().map_err(|x| format!("{what}: {x}"))?;
            check(&what, &got, &want)?;
        }
        done += batch;
    }
    Ok(())
}
