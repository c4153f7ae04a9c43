//! The receive fast path: `LaneRx::handle_chunk` (+ `commit`) at a leaf of an active Broadcast,
//! and the same through `Node` (lane dispatch and routing included), against the bare cost of
//! tracking the same chunk indices in a `HashSet<u32>`, a `Vec<bool>` and a plain `u64`-word
//! bitmap.
//!
//! One operation of 2^20 chunks of 4 KiB (4 GiB), one lane; each timed iteration feeds every
//! chunk once, in order or in a seeded random order. Creating the session, starting the
//! operation and delivering the root's `Go` (the operation is then in its data phase) happen in
//! `with_inputs`, outside the timing.
//!
//! Run: `cargo bench -p ringcast-core --bench receive`

use divan::counter::ItemsCount;
use divan::{Bencher, black_box};
use ringcast_core::lane::LaneRx;
use ringcast_core::wire::{ControlRepr, Imm};
use ringcast_core::{Instant, Node, Placement, Rank};
use std::collections::HashSet;
use std::sync::OnceLock;

mod common;

use common::{CHUNK_SIZE, CHUNKS};
const ORDERS: &[&str] = &["in_order", "random"];

fn main() {
    divan::main();
}

/// Chunk indices in the order they arrive: 0..CHUNKS, or a seeded shuffle of it.
fn order(name: &str) -> &'static [u32] {
    static IN_ORDER: OnceLock<Vec<u32>> = OnceLock::new();
    static RANDOM: OnceLock<Vec<u32>> = OnceLock::new();
    match name {
        "in_order" => IN_ORDER.get_or_init(|| common::order(false)),
        _ => RANDOM.get_or_init(|| common::order(true)),
    }
}

/// The immediates of `order(name)`, as the root (op 0) encodes them.
fn imms(name: &str) -> &'static [u32] {
    static IN_ORDER: OnceLock<Vec<u32>> = OnceLock::new();
    static RANDOM: OnceLock<Vec<u32>> = OnceLock::new();
    let cell = if name == "in_order" {
        &IN_ORDER
    } else {
        &RANDOM
    };
    cell.get_or_init(|| {
        let layout = common::config(1).imm;
        order(name)
            .iter()
            .map(|&chunk| {
                let op_tag = layout.tag_of(0);
                layout.encode(Imm { op_tag, chunk }).expect("chunk fits")
            })
            .collect()
    })
}

/// Rank 1 of 2, in the data phase of a Broadcast of `CHUNKS` chunks from rank 0.
fn leaf() -> Node {
    let mut s = Node::new(common::config(1)).expect("valid config");
    let len = u64::from(CHUNKS) * u64::from(CHUNK_SIZE);
    let op = s
        .start_broadcast(Instant::ZERO, Rank(0), len)
        .expect("op starts");
    let mut buf = Vec::new();
    while s.poll_transmit(&mut buf).is_some() {}
    let mut go = Vec::new();
    ControlRepr::Go { op: op.0 }
        .emit_vec(&mut go)
        .expect("Go encodes");
    s.handle_control(Instant::from_nanos(1), Rank(0), &go);
    while s.poll_transmit(&mut buf).is_some() {}
    s
}

/// Lane 0's receive half of the same leaf, alone: the operation opened as the session asks.
fn lane() -> LaneRx {
    common::lanes(1).remove(0)
}

#[divan::bench(args = ORDERS, sample_count = 20, sample_size = 1)]
fn lane_rx_handle_chunk(bencher: Bencher<'_, '_>, order_name: &str) {
    let imms = imms(order_name);
    bencher
        .counter(ItemsCount::new(imms.len()))
        .with_inputs(lane)
        .bench_local_refs(|rx| {
            for &imm in imms {
                let p = rx.handle_chunk(Rank(0), imm, CHUNK_SIZE as usize);
                // What a copy would use; `black_box` of the whole placement would send it
                // through memory, which no transport does.
                if let Placement::Place { op, offset, len } = p {
                    black_box((offset, len));
                    rx.commit(op);
                }
            }
            debug_assert!(matches!(
                rx.handle_chunk(Rank(0), imms[0], CHUNK_SIZE as usize),
                Placement::Drop(_)
            ));
        });
}

#[divan::bench(args = ORDERS, sample_count = 20, sample_size = 1)]
fn node_handle_chunk(bencher: Bencher<'_, '_>, order_name: &str) {
    let imms = imms(order_name);
    let now = Instant::from_nanos(2);
    bencher
        .counter(ItemsCount::new(imms.len()))
        .with_inputs(leaf)
        .bench_local_refs(|s| {
            for &imm in imms {
                let p = s.handle_chunk(0, Rank(0), imm, CHUNK_SIZE as usize);
                if let Placement::Place { op, .. } = black_box(p) {
                    black_box(s.commit(now, 0, op));
                }
            }
        });
}

#[divan::bench(args = ORDERS, sample_count = 20, sample_size = 1)]
fn baseline_hashset(bencher: Bencher<'_, '_>, order_name: &str) {
    let chunks = order(order_name);
    bencher
        .counter(ItemsCount::new(chunks.len()))
        .with_inputs(|| HashSet::<u32>::with_capacity(CHUNKS as usize))
        .bench_local_refs(|set| {
            for &c in chunks {
                black_box(set.insert(black_box(c)));
            }
        });
}

#[divan::bench(args = ORDERS, sample_count = 20, sample_size = 1)]
fn baseline_vec_bool(bencher: Bencher<'_, '_>, order_name: &str) {
    let chunks = order(order_name);
    bencher
        .counter(ItemsCount::new(chunks.len()))
        .with_inputs(|| (vec![false; CHUNKS as usize], 0u32))
        .bench_local_refs(|(seen, count)| {
            for &c in chunks {
                // Checked like the core checks: out of range and duplicates are dropped.
                if let Some(b) = seen.get_mut(black_box(c) as usize)
                    && !*b
                {
                    *b = true;
                    *count += 1;
                }
            }
            black_box(count);
        });
}

#[divan::bench(args = ORDERS, sample_count = 20, sample_size = 1)]
fn baseline_bit_words(bencher: Bencher<'_, '_>, order_name: &str) {
    let chunks = order(order_name);
    bencher
        .counter(ItemsCount::new(chunks.len()))
        .with_inputs(|| (vec![0u64; CHUNKS as usize / 64], 0u32))
        .bench_local_refs(|(words, count)| {
            for &c in chunks {
                let c = black_box(c) as usize;
                if let Some(w) = words.get_mut(c / 64) {
                    let bit = 1u64 << (c % 64);
                    if *w & bit == 0 {
                        *w |= bit;
                        *count += 1;
                    }
                }
            }
            black_box(count);
        });
}
