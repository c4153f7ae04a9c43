//! Fault campaigns: every fault type, on its own and all together, over several seeds.

mod common;

use common::*;
use ringcast_loopback_sim::{Faults, GilbertElliott, Reorder, RxSlots, Workload};
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

/// A driver whose copy of a placed chunk fails releases it: the core recovers it like a lost
/// one, and every buffer ends right (a failed copy leaves its slot wrong until then).
#[test]
fn failed_copies_are_released_and_recovered() {
    for seed in SEEDS {
        let f = Faults {
            copy_fail: 1e-2,
            ..Faults::default()
        };
        let ag = Workload::new().allgather_uniform(Duration::ZERO, 8, MIB / 8);
        for w in [bcast(0, MIB), ag] {
            let r = run(star(8), w, f.clone(), seed);
            assert_all_ok(&r);
            assert!(r.core.released > 0, "{r}");
            assert_eq!(r.core.released, r.fabric.copy_failed, "{r}");
            assert!(r.chunks_fetched >= r.core.released, "{r}");
        }
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
            copy_fail: 2e-3,
            rx_slots: Some(RxSlots {
                slots: 128,
                service: Duration::from_nanos(340),
            }),
            crashes: Vec::new(),
            links_down: Vec::new(),
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

fn max_depth(r: &ringcast_loopback_sim::Report) -> u32 {
    r.per_rank
        .iter()
        .map(|x| x.max_fetch_depth)
        .max()
        .unwrap_or(0)
}

fn down(from: &str, to: &str, at_us: u64, until_us: u64) -> ringcast_loopback_sim::LinkDown {
    ringcast_loopback_sim::LinkDown {
        from: from.into(),
        to: to.into(),
        at: Duration::from_micros(at_us),
        until: Duration::from_micros(until_us),
    }
}

#[test]
fn spine_links_down_for_a_window_recover_with_bounded_depth() {
    // Both spines lose their link down to leaf 2 for 40 us of an 84 us Broadcast: the 8
    // consecutive ranks under it miss the same ~120 chunks. Every rank ends byte for byte, and
    // no chunk travels through more than log2(32) = 5 ranks' recovery.
    for (seed, root) in [(1, 0), (2, 5), (3, 31)] {
        let f = Faults {
            loss: if seed == 3 { 1e-3 } else { 0.0 },
            links_down: vec![
                down("spine0", "leaf2", 20, 60),
                down("spine1", "leaf2", 20, 60),
            ],
            ..Faults::default()
        };
        let r = run(leaf_spine(32, 8, 2), bcast(root, MIB), f, seed);
        assert_all_ok(&r);
        assert!(r.fabric.lost >= 8, "{r}");
        assert!(max_depth(&r) <= 5, "depth {}\n{r}", max_depth(&r));
    }
}

#[test]
fn spine_link_down_during_an_allgather() {
    let f = Faults {
        links_down: vec![
            down("spine0", "leaf1", 5, 40),
            down("spine1", "leaf1", 5, 40),
        ],
        ..Faults::default()
    };
    let w = Workload::new().allgather_uniform(Duration::ZERO, 32, 64 << 10);
    let r = run(leaf_spine(32, 8, 2), w, f, 4);
    assert_all_ok(&r);
    assert!(r.fabric.lost > 0, "{r}");
    assert!(max_depth(&r) <= 5, "depth {}\n{r}", max_depth(&r));
}

#[test]
fn root_uplink_down_for_a_window_every_leaf_misses_the_same_chunks() {
    for root in [0, 13] {
        // The root's own link up to its leaf switch, down for 6 us (~18 chunks).
        let f = Faults {
            links_down: vec![down(
                &format!("h{root}"),
                &format!("leaf{}", root / 8),
                30,
                36,
            )],
            ..Faults::default()
        };
        let r = run(leaf_spine(32, 8, 2), bcast(root, MIB), f, 5);
        assert_all_ok(&r);
        assert!(r.fabric.lost > 0, "{r}");
        assert!(max_depth(&r) <= 5, "depth {}\n{r}", max_depth(&r));
        // The root is not flooded: each chunk lost on its uplink is read from it by at most
        // the ranks a skip distance away (1..8, 8, 16, 24: ten of the 31 leaves).
        let served = r.per_rank[root as usize].bytes_served;
        assert!(
            served <= 10 * r.fabric.lost * 4096,
            "root served {served} B for {} lost chunks\n{r}",
            r.fabric.lost
        );
    }
}
