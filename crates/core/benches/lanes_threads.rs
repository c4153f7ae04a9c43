//! Aggregate receive throughput of a Broadcast split over 2 lanes, each lane's `LaneRx` fed on
//! its own thread, against the same chunks on 1 lane on 1 thread (and, as a control, 2 lanes fed
//! one after the other on 1 thread).
//!
//! One Broadcast of 2^20 chunks of 4 KiB at rank 1 of 2, opened on the lanes as a `Session`
//! asks (`poll_lane_command`). Each lane gets exactly its own chunks (found once by probing a
//! clone of the lane, outside the timing), in order or in a seeded random order. A sample opens
//! fresh lanes, then times `handle_chunk` + `commit` over every chunk; with 2 threads the span
//! runs from the first thread's start to the last thread's end, both taken after a barrier, so
//! thread start-up is not counted. Reports the fastest and the median of `SAMPLES` samples.
//!
//! Run: `cargo bench -p ringcast-core --bench lanes_threads`

use ringcast_core::lane::LaneRx;
use ringcast_core::wire::Imm;
use ringcast_core::{Placement, Rank};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

mod common;

use common::{CHUNK_SIZE, CHUNKS, config, lanes, order};
const SAMPLES: usize = 100;

/// Per lane, the immediates of its own chunks in `order(random)`.
fn imms_per_lane(n: u16, random: bool) -> Vec<Vec<u32>> {
    let layout = config(n).imm;
    let mut probes = lanes(n);
    let mut out = vec![Vec::new(); usize::from(n)];
    for chunk in order(random) {
        let op_tag = layout.tag_of(0);
        let imm = layout.encode(Imm { op_tag, chunk }).expect("chunk fits");
        let lane = probes
            .iter_mut()
            .position(|rx| {
                matches!(
                    rx.handle_chunk(Rank(0), imm, CHUNK_SIZE as usize),
                    Placement::Place { .. }
                )
            })
            .expect("every chunk has a lane");
        out[lane].push(imm);
    }
    out
}

/// The fast path over one lane's chunks; returns when it started and ended.
fn feed(rx: &mut LaneRx, imms: &[u32]) -> (Instant, Instant) {
    let start = Instant::now();
    for &imm in imms {
        let p = rx.handle_chunk(Rank(0), imm, CHUNK_SIZE as usize);
        if let Placement::Place { op, .. } = black_box(p) {
            rx.commit(op);
        }
    }
    (start, Instant::now())
}

/// One sample: fresh lanes, every lane fed on its own thread (`threads`) or one after the other
/// on this thread. Returns the span from the first start to the last end.
fn sample(n: u16, imms: &[Vec<u32>], threads: bool) -> Duration {
    let mut rx = lanes(n);
    let spans: Vec<(Instant, Instant)> = if threads {
        let barrier = Barrier::new(rx.len());
        std::thread::scope(|s| {
            let handles: Vec<_> = rx
                .iter_mut()
                .zip(imms)
                .map(|(rx, imms)| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        feed(rx, imms)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("feeder runs"))
                .collect()
        })
    } else {
        rx.iter_mut()
            .zip(imms)
            .map(|(rx, imms)| feed(rx, imms))
            .collect()
    };
    let received: u64 = rx.iter().map(|r| r.stats().chunks_received).sum();
    assert_eq!(received, u64::from(CHUNKS), "every chunk placed once");
    let first = spans.iter().map(|s| s.0).min().expect("a lane");
    let last = spans.iter().map(|s| s.1).max().expect("a lane");
    last - first
}

#[allow(clippy::print_stdout)] // a bench binary's report, not a library
fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects cases by name.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    println!(
        "{:<34} {:>9} {:>13} {:>13} {:>13}",
        "case (2^20 chunks in all)", "order", "fastest ns/c", "fastest M/s", "median M/s"
    );
    for random in [false, true] {
        let ord = if random { "random" } else { "in_order" };
        for (name, n, threads) in [
            ("1 lane, 1 thread", 1u16, false),
            ("2 lanes, 2 threads", 2, true),
            ("2 lanes, 1 thread (control)", 2, false),
        ] {
            if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            let imms = imms_per_lane(n, random);
            let mut t: Vec<Duration> = (0..SAMPLES).map(|_| sample(n, &imms, threads)).collect();
            t.sort();
            let per = |d: Duration| d.as_secs_f64() * 1e9 / f64::from(CHUNKS);
            let (fast, med) = (per(t[0]), per(t[SAMPLES / 2]));
            println!(
                "{name:<34} {ord:>9} {fast:>13.2} {:>13.1} {:>13.1}",
                1e3 / fast,
                1e3 / med
            );
        }
    }
}
