//! Simulator throughput: multicast chunk deliveries per second of wall time.
//!
//! Each benchmark runs one whole simulated 16 MiB broadcast (or a 128-rank Allgather of 1 MiB
//! per rank; 4 KiB chunks) and counts the chunk deliveries a lossless run makes. The lossless run of the same shape is the baseline
//! for the lossy one (recovery adds control traffic, timers and reads).
//!
//! `cargo bench -p ringcast-loopback-sim`

use divan::counter::ItemsCount;
use divan::{Bencher, black_box};
use ringcast_loopback_sim::{Faults, Sim, SimConfig, TopologySpec, Workload};
use std::time::Duration;

fn main() {
    divan::main();
}

const SIZE: u64 = 16 << 20;
const CHUNK: u64 = 4096;

fn config(topology: TopologySpec, loss: f64) -> SimConfig {
    let w = Workload::new().broadcast(Duration::ZERO, 0, SIZE);
    let mut cfg = SimConfig::new(topology, w);
    cfg.seed = 7;
    cfg.faults = Faults {
        loss,
        ..Faults::default()
    };
    cfg
}

fn bench(b: Bencher<'_, '_>, topology: TopologySpec, loss: f64) {
    let ranks = u64::from(topology.hosts());
    b.counter(ItemsCount::new((ranks - 1) * SIZE / CHUNK))
        .with_inputs(|| Sim::new(config(topology, loss)).expect("valid config"))
        .bench_local_values(|sim| {
            let r = sim.run();
            assert!(r.all_completed());
            black_box(r.deliveries)
        });
}

/// 64 ranks on one switch.
#[divan::bench(args = [0.0, 1e-4], sample_count = 5, sample_size = 1)]
fn star_64_ranks_16_mib(b: Bencher<'_, '_>, loss: f64) {
    bench(b, TopologySpec::Star { hosts: 64 }, loss);
}

/// 256 ranks, 16 leaves of 16, 4 spines.
#[divan::bench(args = [0.0, 1e-4], sample_count = 3, sample_size = 1)]
fn leaf_spine_256_ranks_16_mib(b: Bencher<'_, '_>, loss: f64) {
    let t = TopologySpec::LeafSpine {
        hosts: 256,
        hosts_per_leaf: 16,
        spines: 4,
    };
    bench(b, t, loss);
}

/// Allgather, 128 ranks x 1 MiB (4 KiB chunks, 4 chains) on a radix-32 fat tree (one pod of
/// 8 edges): ~4.2 M deliveries. The 1024-rank run of the issue is the same shape, 64x bigger.
#[divan::bench(args = [0.0, 1e-4], sample_count = 3, sample_size = 1)]
fn allgather_fat_tree_128_ranks_1_mib(b: Bencher<'_, '_>, loss: f64) {
    const RANKS: u32 = 128;
    const BLOCK: u64 = 1 << 20;
    let topology = TopologySpec::FatTree {
        radix: 32,
        hosts: RANKS,
    };
    let mut cfg = config(topology, loss);
    cfg.workload = Workload::new().allgather_uniform(Duration::ZERO, RANKS, BLOCK);
    let deliveries = u64::from(RANKS) * u64::from(RANKS - 1) * BLOCK / CHUNK;
    b.counter(ItemsCount::new(deliveries))
        .with_inputs(|| Sim::new(cfg.clone()).expect("valid config"))
        .bench_local_values(|sim| {
            let r = sim.run();
            assert!(r.all_completed());
            black_box(r.deliveries)
        });
}
