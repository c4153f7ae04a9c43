//! Seeded randomized differential test: worlds of 1 to 8 ranks (threads) on loopback run
//! random mixes of Broadcast / Allgather / Allgatherv (blocking and non-blocking, in place,
//! typed, waited in shuffled order, some dropped, posts skewed between ranks) over TCP only,
//! multicast only, the default mix, the TCP fallback after a failed start-up check, a rank
//! that multicast never reaches (everything it sends recovered over TCP), with the loss
//! switch armed or not; every rank's result is compared byte for byte with the expected one,
//! buffers pre-filled with garbage.
//!
//! `RINGCAST_RANDOM_SEEDS` worlds (default 8, about 20 s) from `RINGCAST_RANDOM_SEED`
//! (default 1) on; `RINGCAST_RANDOM_WIDE=1`: up to 90 operations per world, up to 50 in
//! flight, each at most a piece; `RINGCAST_RANDOM_DUMP=1`: a failing world's whole plan.
//! Every line names its seed, so a failure replays with `RINGCAST_RANDOM_SEED=<seed>
//! RINGCAST_RANDOM_SEEDS=1`. A campaign: `RINGCAST_RANDOM_SEEDS=1000 cargo test --release -p
//! ringcast --test random_worlds -- --nocapture`.
#![cfg(feature = "rocev2-udp")]
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::Ipv4Addr;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use ringcast::comm::{CommBuilder, Fallback};
use ringcast::{CommError, Communicator, Request};

mod common;
use common::{control_listeners, free_udp_port, nonce, splitmix};

const PIECE: usize = 256 << 10;

struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = splitmix(self.0);
        self.0 % n.max(1)
    }
    fn coin(&mut self, k: u64) -> bool {
        self.next(k) == 0
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Path {
    Tcp,
    Mcast,
    Mix(u64),
    Fallback,
    /// No start-up check, the last rank's multicast goes nowhere: ring recovery fetches it
    /// all (threshold for small ops over TCP as given).
    Lossy(u64),
    /// Like Lossy, with fallback = tcp and the loss switch armed.
    Switch(u64),
    /// fallback = tcp over working multicast, switching on the first chunk fetched.
    Armed(u64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ty {
    U8,
    U32,
    F64,
}
impl Ty {
    fn size(self) -> usize {
        match self {
            Ty::U8 => 1,
            Ty::U32 => 4,
            Ty::F64 => 8,
        }
    }
}

#[derive(Clone, Debug)]
pub enum Kind {
    Bcast { root: u32, count: usize },
    Ag { count: usize },
    Agv { counts: Vec<usize> },
}

#[derive(Clone, Debug)]
pub struct Op {
    pub kind: Kind,
    pub ty: Ty,
    pub blocking: bool,
    /// Per rank (local choice).
    pub in_place: Vec<bool>,
    pub salt: u64,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub n: u32,
    pub path: Path,
    pub lanes: u16,
    /// Allgather chains (`None`: the default a peer table keeps, 4).
    pub chains: Option<u32>,
    pub chunk: Option<u32>,
    pub bw: u64,
    /// Batches of ops; the non-blocking ones of a batch are waited in `order`.
    pub batches: Vec<(Vec<Op>, Vec<usize>)>,
}

/// Bytes of element-count `count` (the blocks) for rank `r` of op `salt`.
fn data(salt: u64, r: u32, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    let mut i = 0u64;
    while out.len() < bytes {
        let w = splitmix(salt ^ (u64::from(r) << 48) ^ i.wrapping_mul(0x9E37));
        for b in w.to_le_bytes() {
            if out.len() < bytes {
                out.push(b);
            }
        }
        i += 1;
    }
    out
}

fn pick_bytes(rng: &mut Rng, n: u32, chunk: usize, path: Path) -> usize {
    let cap = if std::env::var("RINGCAST_RANDOM_WIDE").is_ok() {
        PIECE + 2
    } else {
        chunk * 20_000
    };
    pick_bytes_(rng, n, chunk, path).min(cap)
}

fn pick_bytes_(rng: &mut Rng, n: u32, chunk: usize, path: Path) -> usize {
    let n = n as usize;
    let th = match path {
        Path::Mix(t) => t as usize,
        _ => 64 << 10,
    };
    match rng.next(17) {
        0 => 0,
        16 => (4 + rng.next(16) as usize) * PIECE + rng.next(3) as usize,
        1 => 1 + rng.next(7) as usize,
        2 => chunk - 1 + rng.next(3) as usize,
        3 => PIECE - 1 + rng.next(3) as usize,
        4 => (PIECE / n).saturating_sub(1) + rng.next(3) as usize,
        5 => (th / n).saturating_sub(1) + rng.next(3) as usize,
        6 => th.saturating_sub(1) + rng.next(3) as usize,
        7 => 2 * PIECE - 1 + rng.next(3) as usize,
        8 => 3 * PIECE + 1 + 2 * rng.next(1000) as usize,
        9 => (2 * rng.next(50_000) + 1) as usize,
        10 => rng.next(600_000) as usize,
        11 => (PIECE / n) * (1 + rng.next(2) as usize) + rng.next(3) as usize,
        12 => chunk * (1 + rng.next(40) as usize) - 1 + rng.next(3) as usize,
        _ => rng.next(5000) as usize,
    }
}

pub fn gen_case(seed: u64) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x1234_5678_9ABC_DEF1) ^ 0x55);
    let n = 1 + rng.next(8) as u32;
    let path = match rng.next(7) {
        6 => Path::Armed(if rng.coin(2) { 0 } else { 64 << 10 }),
        4 if n >= 2 => Path::Lossy(if rng.coin(2) { 0 } else { 64 << 10 }),
        5 if n >= 2 => Path::Switch(if rng.coin(2) { 0 } else { 64 << 10 }),
        0 => Path::Tcp,
        1 => Path::Mcast,
        2 => Path::Mix(match rng.next(4) {
            0 => 64 << 10,
            1 => PIECE as u64,
            2 => 1000,
            _ => rng.next(1 << 20),
        }),
        _ => {
            if n >= 2 {
                Path::Fallback
            } else {
                Path::Tcp
            }
        }
    };
    let lanes = 1 + rng.next(3) as u16;
    let chunk = match rng.next(3) {
        0 => None,
        1 => Some(1024),
        2 if rng.coin(6) => Some(16 + rng.next(100) as u32),
        _ if rng.coin(4) => Some(4097 + rng.next(12000) as u32),
        _ => Some(1000 + 2 * rng.next(1500) as u32 + 1),
    };
    // These worlds run on loopback: its default chunk where none is set.
    let ch = chunk.unwrap_or(ringcast::comm::LOOPBACK_CHUNK) as usize;
    let bw = match rng.next(3) {
        0 => 100_000_000,
        1 => 1_000_000_000,
        _ => 20_000_000_000,
    };
    let mut batches = Vec::new();
    let wide = std::env::var("RINGCAST_RANDOM_WIDE").is_ok();
    let nops = if wide {
        30 + rng.next(60)
    } else {
        4 + rng.next(20)
    };
    let mut made = 0;
    let mut salt = seed << 20;
    while made < nops {
        let k = 1 + rng.next(if wide { 50 } else { 10 }).min(nops - made - 1);
        let mut ops = Vec::new();
        let mut nb = 0;
        for _ in 0..k {
            salt += 1;
            let ty = match rng.next(3) {
                0 => Ty::U8,
                1 => Ty::U32,
                _ => Ty::F64,
            };
            let count = |rng: &mut Rng| {
                let b = pick_bytes(rng, n, ch, path);
                let c = b / ty.size();
                if ty != Ty::U8 && rng.coin(3) {
                    c + 1
                } else {
                    c
                }
            };
            let kind = match rng.next(3) {
                0 => Kind::Bcast {
                    root: rng.next(u64::from(n)) as u32,
                    count: count(&mut rng),
                },
                1 => Kind::Ag {
                    count: count(&mut rng) / if rng.coin(2) { n as usize } else { 1 },
                },
                _ => Kind::Agv {
                    counts: (0..n)
                        .map(|_| {
                            if rng.coin(3) {
                                0
                            } else {
                                count(&mut rng) / if rng.coin(2) { n as usize } else { 1 }
                            }
                        })
                        .collect(),
                },
            };
            let blocking = rng.coin(3);
            if !blocking {
                nb += 1;
            }
            let in_place = (0..n).map(|_| rng.coin(2)).collect();
            ops.push(Op {
                kind,
                ty,
                blocking,
                in_place,
                salt,
            });
        }
        let mut order: Vec<usize> = (0..nb).collect();
        for i in (1..order.len()).rev() {
            let j = rng.next(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        batches.push((ops, order));
        made += k;
    }
    // Drawn apart from the stream above, so that every seed's other draws stay as they were.
    let chains = match splitmix(seed ^ 0xC4A1_4500) % 4 {
        0 => None,
        k => Some(k as u32),
    };
    Case {
        n,
        path,
        lanes,
        chains,
        chunk,
        bw,
        batches,
    }
}

/// The expected result's bytes.
fn expected(op: &Op, n: u32) -> Vec<u8> {
    let e = op.ty.size();
    match &op.kind {
        Kind::Bcast { root, count } => data(op.salt, *root, count * e),
        Kind::Ag { count } => (0..n).flat_map(|r| data(op.salt, r, count * e)).collect(),
        Kind::Agv { counts } => (0..n)
            .flat_map(|r| data(op.salt, r, counts[r as usize] * e))
            .collect(),
    }
}

fn typed<T: Pod>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

fn check(what: &str, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} bytes, want {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => {
            let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
            Err(format!(
                "{what}: byte {i} is {:#x}, want {:#x} ({bad} bytes differ of {})",
                got[i],
                want[i],
                want.len()
            ))
        }
    }
}

/// A request waited later: it, the bytes it must hold, what it is, and how to wait on it.
type Waiting = (Pend, Vec<u8>, String, u64);

enum Pend {
    U8(Request<u8>),
    U32(Request<u32>),
    F64(Request<f64>),
}
fn poll<T: Pod>(mut r: Request<T>, how: u64) -> Result<Vec<T>, CommError> {
    if how.is_multiple_of(2) {
        while !r.test() {
            std::thread::yield_now();
        }
        r.wait()
    } else {
        loop {
            match r.wait_timeout(Duration::from_micros(300)) {
                Ok(x) => return x,
                Err(back) => r = back,
            }
        }
    }
}

impl Pend {
    fn wait_how(self, how: u64) -> Result<Vec<u8>, CommError> {
        if how.is_multiple_of(3) {
            return self.wait();
        }
        Ok(match self {
            Pend::U8(r) => poll(r, how)?,
            Pend::U32(r) => bytemuck::cast_slice(&poll(r, how)?).to_vec(),
            Pend::F64(r) => bytemuck::cast_slice(&poll(r, how)?).to_vec(),
        })
    }
    fn wait(self) -> Result<Vec<u8>, CommError> {
        Ok(match self {
            Pend::U8(r) => r.wait()?,
            Pend::U32(r) => bytemuck::cast_slice(&r.wait()?).to_vec(),
            Pend::F64(r) => bytemuck::cast_slice(&r.wait()?).to_vec(),
        })
    }
}
trait Wrap: Pod {
    fn wrap(r: Request<Self>) -> Pend;
}
impl Wrap for u8 {
    fn wrap(r: Request<u8>) -> Pend {
        Pend::U8(r)
    }
}
impl Wrap for u32 {
    fn wrap(r: Request<u32>) -> Pend {
        Pend::U32(r)
    }
}
impl Wrap for f64 {
    fn wrap(r: Request<f64>) -> Pend {
        Pend::F64(r)
    }
}

/// Runs `op` on this rank: blocking (checked here) or posted (returned).
fn run_op<T: Wrap>(comm: &Communicator, op: &Op, want: &[u8]) -> Result<Option<Pend>, String> {
    let me = comm.rank();
    let n = comm.size();
    let e = op.ty.size();
    let e_ = |x: CommError| x.to_string();
    let ip = op.in_place[me as usize];
    match &op.kind {
        Kind::Bcast { root, count } => {
            let mut buf: Vec<T> = if me == *root {
                typed(want)
            } else {
                typed(&vec![0xA7u8; count * e])
            };
            if op.blocking {
                comm.broadcast(*root, &mut buf).map_err(e_)?;
                check("bcast", bytemuck::cast_slice(&buf), want)?;
                Ok(None)
            } else {
                Ok(Some(T::wrap(comm.ibroadcast(*root, buf).map_err(e_)?)))
            }
        }
        kind => {
            let counts: Vec<usize> = match kind {
                Kind::Ag { count } => vec![*count; n as usize],
                Kind::Agv { counts } => counts.clone(),
                _ => unreachable!(),
            };
            let at: usize = counts[..me as usize].iter().sum::<usize>() * e;
            let mine_b = &want[at..at + counts[me as usize] * e];
            let mine: Vec<T> = typed(mine_b);
            let mut recv_b = vec![if ip { 0xE5u8 } else { 0x3C }; want.len()];
            if ip {
                recv_b[at..at + mine_b.len()].copy_from_slice(mine_b);
            }
            let mut recv: Vec<T> = typed(&recv_b);
            let is_ag = matches!(kind, Kind::Ag { .. });
            if op.blocking {
                match (ip, is_ag) {
                    (true, true) => comm.allgather_in_place(&mut recv),
                    (true, false) => comm.allgatherv_in_place(&mut recv, &counts),
                    (false, true) => comm.allgather(&mine, &mut recv),
                    (false, false) => comm.allgatherv(&mine, &mut recv, &counts),
                }
                .map_err(e_)?;
                check("allgather(v)", bytemuck::cast_slice(&recv), want)?;
                Ok(None)
            } else {
                let r = match (ip, is_ag) {
                    (true, true) => comm.iallgather_in_place(recv),
                    (true, false) => comm.iallgatherv_in_place(recv, &counts),
                    (false, true) => comm.iallgather(&mine, recv),
                    (false, false) => comm.iallgatherv(&mine, recv, &counts),
                }
                .map_err(e_)?;
                Ok(Some(T::wrap(r)))
            }
        }
    }
}

fn rank_main(comm: &Communicator, case: &Case) -> Result<(), String> {
    let n = comm.size();
    let mut idx = 0;
    for (bi, (ops, order)) in case.batches.iter().enumerate() {
        let mut pend: Vec<(Pend, Vec<u8>, String, u64)> = Vec::new();
        for op in ops {
            let want = expected(op, n);
            let what = format!(
                "batch {bi} op {idx} {:?} {:?} blocking={} in_place={}",
                op.kind,
                op.ty,
                op.blocking,
                op.in_place[comm.rank() as usize]
            );
            idx += 1;
            // Ranks skewed: some post late (pieces and rounds arrive before the post).
            let skew = splitmix(op.salt ^ 0x5EED ^ u64::from(comm.rank()));
            if skew.is_multiple_of(4) {
                thread::sleep(Duration::from_micros((skew >> 8) % 20_000));
            }
            let r = match op.ty {
                Ty::U8 => run_op::<u8>(comm, op, &want),
                Ty::U32 => run_op::<u32>(comm, op, &want),
                Ty::F64 => run_op::<f64>(comm, op, &want),
            }
            .map_err(|x| format!("{what}: {x}"))?;
            if let Some(p) = r {
                pend.push((p, want, what, splitmix(op.salt ^ u64::from(comm.rank()))));
            }
        }
        let mut slots: Vec<Option<Waiting>> = pend.into_iter().map(Some).collect();
        let mut ordered: Vec<Waiting> = order
            .iter()
            .map(|&i| slots[i].take().expect("once"))
            .collect();
        let local = splitmix(bi as u64 ^ (u64::from(comm.rank()) << 32) ^ 0xABCD);
        // Sometimes one request is dropped unwaited (its operation still runs).
        if !ordered.is_empty() && local.is_multiple_of(11) {
            let (p, ..) = ordered.remove((local >> 8) as usize % ordered.len());
            drop(p);
        }
        let wait_all = |list: Vec<Waiting>| -> Result<(), String> {
            for (p, want, what, how) in list {
                let got = p.wait_how(how).map_err(|x| format!("{what}: wait: {x}"))?;
                check(&what, &got, &want)?;
            }
            Ok(())
        };
        if ordered.len() >= 2 && (local >> 16).is_multiple_of(3) {
            // Half of them waited on another thread at the same time.
            let other = ordered.split_off(ordered.len() / 2);
            thread::scope(|s| {
                let h = s.spawn(|| wait_all(other));
                let a = wait_all(ordered);
                let b = h
                    .join()
                    .map_err(|_| "waiting thread panicked".to_string())?;
                a.and(b)
            })?;
        } else {
            wait_all(ordered)?;
        }
    }
    Ok(())
}

fn builder_for(case: &Case, r: u32, port: u16) -> CommBuilder {
    let mut b = Communicator::builder()
        .interface(Ipv4Addr::LOCALHOST)
        .udp_port(port)
        .lanes(case.lanes)
        .peer_timeout(Duration::from_secs(10))
        .startup_check(Duration::from_secs(6))
        .link_bandwidth(case.bw)
        .cutoff_alpha(Duration::from_millis(if case.bw > 1_000_000_000 {
            1
        } else {
            20
        }));
    if let Some(c) = case.chunk {
        b = b.chunk_size(c);
    }
    if let Some(c) = case.chains {
        b = b.allgather_chains(c);
    }
    match case.path {
        Path::Tcp => b.tcp_threshold(1 << 40),
        Path::Mcast => b.tcp_threshold(0),
        Path::Mix(t) => b.tcp_threshold(t),
        Path::Armed(t) => b
            .tcp_threshold(t)
            .fallback(Fallback::Tcp)
            .fallback_loss_threshold(0.0)
            .link_bandwidth(20_000_000_000)
            .cutoff_alpha(Duration::from_millis(1)),
        Path::Lossy(t) | Path::Switch(t) => {
            let b = b.startup_check(Duration::ZERO).tcp_threshold(t);
            let b = if let Path::Switch(_) = case.path {
                b.fallback(Fallback::Tcp).fallback_loss_threshold(0.1)
            } else {
                b
            };
            if r == case.n - 1 {
                b.udp_port(port.wrapping_add(1).max(1024))
            } else {
                b
            }
        }
        Path::Fallback => {
            let b = b
                .fallback(Fallback::Tcp)
                .tcp_threshold(0)
                .startup_check(Duration::from_millis(800));
            if r == case.n - 1 {
                b.udp_port(port.wrapping_add(1).max(1024))
            } else {
                b
            }
        }
    }
}

pub fn run_case(seed: u64, case: Case) -> Result<(), String> {
    let n = case.n;
    let case = Arc::new(case);
    let nonce = nonce(seed);
    let port = free_udp_port();
    let (listeners, table) = control_listeners(n);
    let (tx, rx) = mpsc::channel();
    // Every rank keeps its communicator until all are done: a request dropped unwaited
    // still runs, and its rank must stay to pass its pieces on.
    let all_done = Arc::new(std::sync::Barrier::new(n as usize));
    for (r, l) in listeners.into_iter().enumerate() {
        let (table, tx, case, all_done) =
            (table.clone(), tx.clone(), case.clone(), all_done.clone());
        thread::Builder::new()
            .name(format!("diff-rank{r}"))
            .spawn(move || {
                let r = r as u32;
                let out = builder_for(&case, r, port)
                    .rank(r)
                    .world_size(n)
                    .peer_table(table, nonce)
                    .control_listener(l)
                    .build()
                    .map_err(|e| format!("build: {e}"))
                    .map(|comm| {
                        let out = rank_main(&comm, &case);
                        if r == 0 && matches!(case.path, Path::Armed(_) | Path::Switch(_)) {
                            eprintln!("  mode: {:?}", comm.transport_mode());
                        }
                        let _ = tx.send((r, out));
                        all_done.wait();
                    });
                if let Err(e) = out {
                    let _ = tx.send((r, Err(e)));
                    all_done.wait();
                }
            })
            .expect("spawn");
    }
    drop(tx);
    let deadline = Duration::from_secs(90);
    let end = Instant::now() + deadline;
    let mut errors = Vec::new();
    for _ in 0..n {
        match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
            Ok((_, Ok(()))) => {}
            Ok((r, Err(e))) => errors.push(format!("rank {r}: {e}")),
            Err(_) => {
                errors.push(format!("HANG: not all ranks finished within {deadline:?}"));
                break;
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

fn env_u64(name: &str, d: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

#[test]
fn randomized_differential() {
    let first = env_u64("RINGCAST_RANDOM_SEED", 1);
    let count = env_u64("RINGCAST_RANDOM_SEEDS", 8);
    let mut failures = Vec::new();
    for seed in first..first + count {
        let case = gen_case(seed);
        let t = Instant::now();
        let desc = format!(
            "seed {seed}: n={} path={:?} lanes={} chains={:?} chunk={:?} bw={} ops={}",
            case.n,
            case.path,
            case.lanes,
            case.chains,
            case.chunk,
            case.bw,
            case.batches.iter().map(|b| b.0.len()).sum::<usize>()
        );
        let dump = format!("{:#?}", case.batches);
        match run_case(seed, case) {
            Ok(()) => eprintln!("PASS {desc} ({:.1?})", t.elapsed()),
            Err(e) => {
                eprintln!("FAIL {desc}\n{e}");
                if std::env::var("RINGCAST_RANDOM_DUMP").is_ok() {
                    eprintln!("{dump}");
                }
                failures.push(desc);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
