//! Fault campaigns: every fault type, on its own and all together, over several seeds.

mod common;

use common::*;
use ringcast_loopback_sim::{Faults, GilbertElliott, Reorder, RxSlots};
use std::time::Duration;

const SEEDS: [u64; 3] = [1, 2, 3];

#[test]
fn lossless_broadcast_needs_no_recovery() {
    let r = run(star(16), bcast(3, MIB), Faults::default(), 0);
    assert_all_ok(&r);
    assert_eq!(r.chunks_fetched, 0);
    assert_eq!(r.deliveries, 15 * 256);
}

#[test]
fn bernoulli_loss_recovers_through_the_ring() {
    for seed in SEEDS {
        let f = Faults {
            loss: 1e-2,
            ..Faults::default()
        };
        let r = run(leaf_spine(24, 8, 2), bcast(5, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.lost > 0 && r.chunks_fetched > 0, "{r}");
    }
}

#[test]
fn burst_loss_recovers() {
    for seed in SEEDS {
        let f = Faults {
            burst: Some(GilbertElliott {
                enter_bad: 2e-3,
                exit_bad: 0.2,
            }),
            ..Faults::default()
        };
        let r = run(star(16), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.burst_lost > 0, "{r}");
    }
}

#[test]
fn reordering_is_harmless() {
    for seed in SEEDS {
        let f = Faults {
            reorder: Some(Reorder {
                probability: 0.2,
                max_delay: Duration::from_micros(5),
            }),
            ..Faults::default()
        };
        let r = run(star(16), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.reordered > 0, "{r}");
    }
}

#[test]
fn duplicates_are_dropped_by_the_core() {
    for seed in SEEDS {
        let f = Faults {
            duplicate: 0.05,
            ..Faults::default()
        };
        let r = run(star(16), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.duplicated > 0, "{r}");
        assert_eq!(r.core.duplicate, r.fabric.duplicated, "{r}");
    }
}

#[test]
fn payload_corruption_is_dropped_by_the_checksum_and_recovered() {
    for seed in SEEDS {
        let f = Faults {
            corrupt_payload: 1e-2,
            ..Faults::default()
        };
        let r = run(star(16), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(
            r.fabric.corrupted_payload > 0 && r.chunks_fetched > 0,
            "{r}"
        );
    }
}

#[test]
fn immediate_corruption_is_dropped_by_the_checksum_and_recovered() {
    // The transport's integrity check covers the immediate: a flipped chunk index never
    // reaches the core (which could not tell it from another valid chunk).
    for seed in SEEDS {
        let f = Faults {
            corrupt_imm: 1e-2,
            ..Faults::default()
        };
        let r = run(star(16), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.corrupted_imm > 0 && r.chunks_fetched > 0, "{r}");
        assert_eq!(
            r.core.stale + r.core.out_of_range + r.core.wrong_source,
            0,
            "{r}"
        );
    }
}

#[test]
fn op_tag_corruption_escaping_the_checksum_is_dropped_by_the_core() {
    for seed in SEEDS {
        let f = Faults {
            corrupt_escaping: 1e-2,
            ..Faults::default()
        };
        let r = run(star(16), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.escaped_checksum > 0, "{r}");
        assert_eq!(r.core.stale, r.fabric.escaped_checksum, "{r}");
    }
}

#[test]
fn receiver_overrun_drops_are_recovered() {
    for seed in SEEDS {
        let f = Faults {
            // 4 KiB chunks arrive every 328 ns; reposting takes 500 ns: the queue runs dry.
            rx_slots: Some(RxSlots {
                slots: 16,
                service: Duration::from_nanos(500),
            }),
            ..Faults::default()
        };
        let r = run(star(8), bcast(0, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.rnr > 0 && r.chunks_fetched > 0, "{r}");
    }
}

#[test]
fn everything_at_once() {
    for seed in 10..14 {
        let f = Faults {
            loss: 2e-3,
            burst: Some(GilbertElliott {
                enter_bad: 5e-4,
                exit_bad: 0.3,
            }),
            duplicate: 1e-2,
            reorder: Some(Reorder {
                probability: 0.05,
                max_delay: Duration::from_micros(3),
            }),
            corrupt_payload: 2e-3,
            corrupt_imm: 2e-3,
            corrupt_escaping: 2e-3,
            rx_slots: Some(RxSlots {
                slots: 128,
                service: Duration::from_nanos(340),
            }),
            crashes: Vec::new(),
        };
        let r = run(
            leaf_spine(32, 8, 2),
            bcast(seed as u32 % 32, 2 * MIB),
            f,
            seed,
        );
        assert_all_ok(&r);
    }
}

#[test]
fn root_crash_fails_every_survivor_naming_the_root() {
    for at_us in [0, 20, 60, 200] {
        let f = Faults {
            loss: 1e-3,
            crashes: vec![ringcast_loopback_sim::Crash {
                rank: 2,
                at: Duration::from_micros(at_us),
            }],
            ..Faults::default()
        };
        let r = run(leaf_spine(16, 4, 2), bcast(2, MIB), f, at_us);
        assert_survivors_ok(&r, &[2]);
        if at_us <= 60 {
            // The root died before sending everything: nobody can complete.
            assert_eq!((r.ops[0].completed, r.ops[0].crashed), (0, 1), "{r}");
        }
    }
}

#[test]
fn leaf_crash_completes_or_names_the_leaf() {
    for (rank, at_us) in [(1, 10), (5, 40), (7, 60), (15, 100)] {
        let f = Faults {
            loss: 5e-3,
            crashes: vec![ringcast_loopback_sim::Crash {
                rank,
                at: Duration::from_micros(at_us),
            }],
            ..Faults::default()
        };
        let r = run(leaf_spine(16, 4, 2), bcast(0, MIB), f, u64::from(rank));
        assert_survivors_ok(&r, &[rank]);
    }
}

#[test]
fn same_seed_same_report() {
    let f = Faults {
        loss: 5e-3,
        duplicate: 1e-2,
        ..Faults::default()
    };
    let a = run(leaf_spine(16, 4, 2), bcast(1, MIB), f.clone(), 42);
    let b = run(leaf_spine(16, 4, 2), bcast(1, MIB), f.clone(), 42);
    let c = run(leaf_spine(16, 4, 2), bcast(1, MIB), f, 43);
    assert_eq!(a, b);
    assert_ne!(a, c);
}
