//! Several broadcasts in flight at once, from different roots.

mod common;

use common::*;
use ringcast_loopback_sim::{Faults, Workload};
use std::time::Duration;

#[test]
fn concurrent_broadcasts_from_different_roots() {
    let w = Workload::new()
        .broadcast(Duration::ZERO, 0, MIB)
        .broadcast(Duration::ZERO, 5, MIB)
        .broadcast(Duration::from_micros(20), 11, 512 << 10)
        .broadcast(Duration::from_micros(30), 5, 256 << 10);
    for seed in [1, 2] {
        let f = Faults {
            loss: 1e-3,
            ..Faults::default()
        };
        let r = run(leaf_spine(16, 4, 2), w.clone(), f, seed);
        assert_all_ok(&r);
        assert_eq!(r.ops.len(), 4);
        assert!(r.ops.iter().all(|o| o.completed == 16), "{r}");
    }
}

#[test]
fn later_broadcast_after_earlier_finished() {
    let w = Workload::new().broadcast(Duration::ZERO, 1, MIB).broadcast(
        Duration::from_millis(1),
        2,
        MIB,
    );
    let r = run(star(8), w, Faults::default(), 0);
    assert_all_ok(&r);
    assert_eq!(r.chunks_fetched, 0, "{r}");
}
