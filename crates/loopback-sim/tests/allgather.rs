//! Allgather(v) as a composition of broadcasts: every rank ends with every block.

mod common;

use common::*;
use ringcast_loopback_sim::{Crash, Faults, OpKind, Sim, SimConfig, TopologySpec, Workload};
use std::time::Duration;

const KIB: u64 = 1 << 10;

fn lossy(loss: f64) -> Faults {
    Faults {
        loss,
        ..Faults::default()
    }
}

fn ag(ranks: u32, size: u64) -> Workload {
    Workload::new().allgather_uniform(Duration::ZERO, ranks, size)
}

fn run_chains(
    t: TopologySpec,
    w: Workload,
    f: Faults,
    seed: u64,
    chains: u32,
) -> ringcast_loopback_sim::Report {
    let mut cfg = SimConfig::new(t, w);
    cfg.seed = seed;
    cfg.faults = f;
    cfg.chains = chains;
    Sim::new(cfg).expect("valid config").run()
}

#[test]
fn lossless_allgather_on_a_star_multicasts_each_block_once() {
    let r = run(star(8), ag(8, 64 * KIB), Faults::default(), 0);
    assert_all_ok(&r);
    assert_eq!(r.chunks_fetched, 0, "{r}");
    assert_eq!(r.deliveries, 8 * 16 * 7);
    for rank in &r.per_rank {
        assert_eq!(
            rank.bytes_sent,
            64 * KIB,
            "each root injects its block once"
        );
    }
    // Every byte crosses each host uplink once and each downlink once per other root.
    assert_eq!(r.levels[0].up_bytes, 8 * 64 * KIB);
    assert_eq!(r.levels[0].down_bytes, 8 * 7 * 64 * KIB);
}

#[test]
fn allgather_with_loss_on_star_leaf_spine_and_fat_tree() {
    let shapes = [
        star(12),
        leaf_spine(24, 8, 3),
        TopologySpec::FatTree {
            radix: 4,
            hosts: 14,
        },
    ];
    for (i, t) in shapes.into_iter().enumerate() {
        for seed in [1, 2] {
            let ranks = t.hosts();
            let r = run(
                t,
                ag(ranks, 48 * KIB + 100),
                lossy(5e-3),
                seed + 10 * i as u64,
            );
            assert_all_ok(&r);
            assert!(r.fabric.lost > 0 && r.chunks_fetched > 0, "{r}");
        }
    }
}

#[test]
fn allgatherv_with_zero_and_odd_sizes() {
    let sizes = [0, 10_000, 4096, 0, 1, 70_000, 0, 12_345, 8191];
    let w = Workload::new().allgather(Duration::ZERO, &sizes);
    for seed in [3, 4] {
        let r = run(leaf_spine(9, 4, 2), w.clone(), lossy(1e-2), seed);
        assert_all_ok(&r);
        for (rank, s) in r.per_rank.iter().zip(sizes) {
            assert_eq!(rank.bytes_sent, s);
        }
    }
    // All zero: completes at once, nothing moves.
    let w = Workload::new().allgather(Duration::ZERO, &[0; 5]);
    let r = run(star(5), w, Faults::default(), 0);
    assert_all_ok(&r);
    assert_eq!(r.deliveries, 0);
}

#[test]
fn ranks_not_divisible_by_chains() {
    for (ranks, chains) in [(7, 3), (10, 4), (5, 8), (6, 1)] {
        let r = run_chains(star(ranks), ag(ranks, 32 * KIB), lossy(2e-3), 5, chains);
        assert_all_ok(&r);
    }
}

#[test]
fn a_crash_fails_survivors_with_typed_errors_naming_it() {
    for (rank, at_us) in [(3, 5), (0, 40), (9, 150)] {
        let f = Faults {
            loss: 1e-3,
            crashes: vec![Crash {
                rank,
                at: Duration::from_micros(at_us),
            }],
            ..Faults::default()
        };
        let r = run(leaf_spine(12, 4, 2), ag(12, 64 * KIB), f, u64::from(rank));
        assert_survivors_ok(&r, &[rank]);
    }
}

#[test]
fn concurrent_allgathers_and_broadcasts_fsdp_pipeline() {
    // Layer i's parameters are allgathered while layer i-1's broadcasts still run.
    let ranks = 16;
    let mut w = Workload::new();
    for layer in 0..3u32 {
        let at = Duration::from_micros(u64::from(layer) * 30);
        w = w
            .allgather_uniform(at, ranks, 32 * KIB + u64::from(layer) * 1000)
            .broadcast(at, layer * 5, 128 * KIB);
    }
    for seed in [1, 2] {
        let r = run(leaf_spine(ranks, 4, 2), w.clone(), lossy(2e-3), seed);
        assert_all_ok(&r);
        assert_eq!(r.ops.len(), 6);
        assert!(r.ops.iter().all(|o| o.completed == ranks), "{r}");
        assert!(matches!(r.ops[0].kind, OpKind::Allgather { .. }));
    }
}

#[test]
fn same_seed_same_allgather_report() {
    let t = TopologySpec::FatTree {
        radix: 4,
        hosts: 16,
    };
    let a = run(t, ag(16, 32 * KIB), lossy(5e-3), 9);
    let b = run(t, ag(16, 32 * KIB), lossy(5e-3), 9);
    assert_eq!(a, b);
}

#[test]
fn wrong_sizes_length_is_a_config_error() {
    let w = Workload::new().allgather(Duration::ZERO, &[1, 2, 3]);
    assert!(Sim::new(SimConfig::new(star(4), w)).is_err());
}

#[test]
fn a_time_limit_past_the_virtual_clock_is_a_config_error() {
    let w = Workload::new().allgather(Duration::ZERO, &[1, 2, 3, 4]);
    let mut cfg = SimConfig::new(star(4), w);
    cfg.time_limit = ringcast_loopback_sim::MAX_TIME_LIMIT;
    assert!(Sim::new(cfg.clone()).is_ok());
    cfg.time_limit += Duration::from_nanos(1);
    let Err(e) = Sim::new(cfg) else {
        panic!("a time limit past the clock was taken")
    };
    assert!(e.to_string().contains("time limit"), "{e}");
}
