//! Large runs: the sizes the issue names.

mod common;

use common::*;
use ringcast_loopback_sim::Faults;

#[test]
fn leaf_spine_256_ranks_16_mib_with_loss() {
    let f = Faults {
        loss: 1e-4,
        ..Faults::default()
    };
    let r = run(leaf_spine(256, 16, 4), bcast(0, 16 * MIB), f, 7);
    assert_all_ok(&r);
    assert_eq!(r.per_rank.len(), 256);
    assert!(r.fabric.lost > 0 && r.chunks_fetched > 0, "{r}");
    // Every byte crosses each tree link once: the root's uplink carries exactly 16 MiB.
    assert_eq!(r.per_rank[0].bytes_sent, 16 * MIB);
}
