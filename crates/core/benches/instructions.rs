//! Instructions per chunk of the receive fast path, `LaneRx::handle_chunk` followed by
//! `LaneRx::commit`, counted by callgrind through gungraun so that the counts repeat exactly.
//!
//! The lane is lane 0 of rank 1 of 2, with one Broadcast of 2^20 chunks of 4 KiB open (as in
//! `receive.rs`); each measured call feeds [`FED`] chunks, in order or in a seeded random order,
//! so the count of a call divided by [`FED`] is the cost of one chunk (the call's own entry and
//! exit are ~0.01 instructions per chunk). Building the lane and the immediates is outside the
//! measurement. Two baselines in the same run: the bare loop (read the immediate, `black_box` it)
//! and a checked test-and-set on a `Vec<u64>` bitmap.
//!
//! Run: `cargo bench -p ringcast-core --bench instructions`. Needs valgrind and
//! `gungraun-runner` 0.20.0 (`cargo install gungraun-runner --version 0.20.0`); where either is
//! missing it says so and exits 0.

use ringcast_core::lane::LaneRx;
use ringcast_core::wire::Imm;
use std::process::Command;

mod common;

use common::{CHUNK_SIZE, CHUNKS};
/// Chunks fed per measured call.
const FED: usize = 4096;

/// The first [`FED`] chunk indices: `0..FED`, or the head of the shuffle `receive.rs` uses.
fn order(random: bool) -> Vec<u32> {
    let mut v = common::order(random);
    v.truncate(FED);
    v
}

/// The immediates of `order(random)`, as the root (op 0) encodes them.
fn imms(random: bool) -> Vec<u32> {
    let layout = common::config(1).imm;
    order(random)
        .into_iter()
        .map(|chunk| {
            let op_tag = layout.tag_of(0);
            layout.encode(Imm { op_tag, chunk }).expect("chunk fits")
        })
        .collect()
}

/// Lane 0's receive half of a leaf of the Broadcast, opened as the session asks, and the
/// immediates to feed it.
fn lane(random: bool) -> (LaneRx, Vec<u32>) {
    (common::lanes(1).remove(0), imms(random))
}

/// A `Vec<u64>` bitmap of `CHUNKS` bits and the chunk indices to set in it.
fn bit_words(random: bool) -> (Vec<u64>, Vec<u32>) {
    (vec![0u64; CHUNKS as usize / 64], order(random))
}

mod callgrind {
    use super::{CHUNK_SIZE, bit_words, imms, lane};
    use gungraun::{library_benchmark, library_benchmark_group};
    use ringcast_core::lane::LaneRx;
    use ringcast_core::{Placement, Rank};
    use std::hint::black_box;

    #[library_benchmark]
    #[bench::in_order(lane(false))]
    #[bench::random(lane(true))]
    fn lane_rx_handle_chunk((mut rx, imms): (LaneRx, Vec<u32>)) -> LaneRx {
        for &imm in &imms {
            let p = rx.handle_chunk(Rank(0), imm, CHUNK_SIZE as usize);
            if let Placement::Place { op, offset, len } = p {
                black_box((offset, len));
                rx.commit(op);
            }
        }
        rx
    }

    // The claim alone, without the commit that follows the copy.
    #[library_benchmark]
    #[bench::in_order(lane(false))]
    #[bench::random(lane(true))]
    fn lane_rx_place_only((mut rx, imms): (LaneRx, Vec<u32>)) -> LaneRx {
        for &imm in &imms {
            let p = rx.handle_chunk(Rank(0), imm, CHUNK_SIZE as usize);
            if let Placement::Place { offset, len, .. } = p {
                black_box((offset, len));
            }
        }
        rx
    }

    // The loop alone: what every chunk costs before the fast path runs.
    #[library_benchmark]
    #[bench::in_order(imms(false))]
    #[bench::random(imms(true))]
    fn baseline_loop(imms: Vec<u32>) -> Vec<u32> {
        for &imm in &imms {
            black_box(imm);
        }
        imms
    }

    // Checked test-and-set and count on a plain `u64`-word bitmap.
    #[library_benchmark]
    #[bench::in_order(bit_words(false))]
    #[bench::random(bit_words(true))]
    fn baseline_bit_words((mut words, chunks): (Vec<u64>, Vec<u32>)) -> (Vec<u64>, u32) {
        let mut count = 0u32;
        for &c in &chunks {
            let c = black_box(c) as usize;
            if let Some(w) = words.get_mut(c / 64) {
                let bit = 1u64 << (c % 64);
                if *w & bit == 0 {
                    *w |= bit;
                    count += 1;
                }
            }
        }
        (words, count)
    }

    library_benchmark_group!(
        name = receive,
        benchmarks = [
            lane_rx_handle_chunk,
            lane_rx_place_only,
            baseline_loop,
            baseline_bit_words
        ]
    );

    gungraun::main!(library_benchmark_groups = receive);

    /// The `main` that gungraun generates, run by ours once the tools are known to be there.
    pub(super) fn run() {
        main();
    }
}

/// Why the benchmark cannot run here, if it cannot: valgrind or a matching runner is missing.
fn missing_tool() -> Option<String> {
    let ok = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    if ok("valgrind").is_none() {
        return Some("valgrind not found (apt-get install -y valgrind)".into());
    }
    let runner = std::env::var("GUNGRAUN_RUNNER").unwrap_or_else(|_| "gungraun-runner".into());
    match ok(&runner) {
        None => Some(format!(
            "{runner} not found (cargo install gungraun-runner --version 0.20.0)"
        )),
        Some(v) if !v.contains("0.20.0") => Some(format!(
            "{runner} is {}, the bench needs 0.20.0 \
             (cargo install gungraun-runner --version 0.20.0)",
            v.trim()
        )),
        Some(_) => None,
    }
}

#[allow(clippy::print_stderr)] // a bench binary's report, not a library
fn main() {
    // Under the runner (valgrind already running us), go straight to gungraun's `main`.
    let under_runner = std::env::args().nth(1).as_deref() == Some("--gungraun-run");
    if !under_runner && let Some(why) = missing_tool() {
        eprintln!("instructions bench skipped: {why}");
        return;
    }
    callgrind::run();
}
