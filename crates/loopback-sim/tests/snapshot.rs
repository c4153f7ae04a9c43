//! The report of a small lossy run, as reviewed YAML.

mod common;

use common::*;
use ringcast_loopback_sim::Faults;

#[test]
fn small_lossy_star_report() {
    let f = Faults {
        loss: 2e-2,
        duplicate: 1e-2,
        ..Faults::default()
    };
    let r = run(star(4), bcast(1, 64 << 10), f, 3);
    assert_all_ok(&r);
    insta::assert_yaml_snapshot!(r);
}

/// Allgatherv on a 4-rank leaf/spine with loss: per-level bytes, recovery, every rank's block.
#[test]
fn small_lossy_allgatherv_report() {
    let f = Faults {
        loss: 5e-2,
        ..Faults::default()
    };
    let w = ringcast_loopback_sim::Workload::new()
        .allgather(std::time::Duration::ZERO, &[16 << 10, 0, 10_000, 20 << 10]);
    let r = run(leaf_spine(4, 2, 2), w, f, 5);
    assert_all_ok(&r);
    assert!(r.fabric.lost > 0 && r.chunks_fetched > 0, "{r}");
    insta::assert_yaml_snapshot!(r);
}
