//! What the receive-path benches share: the workload (one Broadcast of `CHUNKS` chunks of
//! `CHUNK_SIZE` at rank 1 of 2), the arrival orders, and lanes opened as a session asks.
// Each bench uses its own subset.
#![allow(dead_code)]

use ringcast_core::lane::{LaneCommand, LaneRx};
use ringcast_core::{Config, Instant, Rank, Session};
use std::time::Duration;

pub(crate) const CHUNKS: u32 = 1 << 20;
pub(crate) const CHUNK_SIZE: u32 = 4096;

/// Rank 1 of 2 with `lanes` lanes; timers far away (no timeout is ever delivered).
pub(crate) fn config(lanes: u16) -> Config {
    let mut c = Config::new(1, 2);
    c.chunk_size = CHUNK_SIZE;
    c.lanes = lanes;
    c.peer_timeout = Duration::from_secs(3600);
    c.limits.max_chunks_per_op = CHUNKS;
    c
}

/// `0..CHUNKS`, or a seeded xorshift shuffle of it.
pub(crate) fn order(random: bool) -> Vec<u32> {
    let mut v: Vec<u32> = (0..CHUNKS).collect();
    if random {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64; // xorshift64, fixed seed
        for i in (1..v.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
    }
    v
}

/// Every lane's receive half of the leaf, with the Broadcast opened as the session asks.
pub(crate) fn lanes(n: u16) -> Vec<LaneRx> {
    let c = config(n);
    let mut s = Session::new(c.clone()).expect("valid config");
    let len = u64::from(CHUNKS) * u64::from(CHUNK_SIZE);
    s.start_broadcast(Instant::ZERO, Rank(0), len)
        .expect("op starts");
    let mut rx: Vec<LaneRx> = (0..n).map(|l| LaneRx::new(&c, l)).collect();
    while let Some(cmd) = s.poll_lane_command() {
        if let LaneCommand::Rx { lane, cmd } = cmd {
            rx[usize::from(lane)].handle_command(cmd);
        }
    }
    rx
}
