//! Small configurations of every table of the study (`cargo xtask figures`), as snapshots: a
//! change that moves a number shows up in review.

use ringcast_loopback_sim::TopologySpec;
use ringcast_loopback_sim::baselines::study;

const KIB: u64 = 1024;

fn fat_tree_16() -> TopologySpec {
    TopologySpec::FatTree {
        radix: 4,
        hosts: 16,
    }
}

fn leaf_spine_12() -> TopologySpec {
    TopologySpec::LeafSpine {
        hosts: 12,
        hosts_per_leaf: 4,
        spines: 2,
    }
}

#[test]
fn traffic_table() {
    let rows = study::traffic(fat_tree_16(), 64 * KIB, 2).expect("runs");
    // Multicast moves fewer bytes than either unicast baseline.
    assert!(rows.iter().all(|r| r.ratio_to_ringcast >= 1.0), "{rows:?}");
    insta::assert_snapshot!(study::traffic_markdown(&rows));
}

#[test]
fn sizes_table() {
    let rows = study::sizes(leaf_spine_12(), &[4 * KIB, 256 * KIB], 2).expect("runs");
    assert!(rows.iter().all(|r| r.completion_ns.is_some()), "{rows:?}");
    insta::assert_snapshot!(study::sizes_markdown(&rows));
}

#[test]
fn loss_table() {
    let rows = study::loss(fat_tree_16(), 2048 * KIB, &[1e-4, 1e-3], 2).expect("runs");
    assert!(rows.iter().all(|r| r.completion_ns.is_some()), "{rows:?}");
    insta::assert_snapshot!(study::loss_markdown(&rows));
}

#[test]
fn concurrent_table() {
    let rows = study::concurrent(leaf_spine_12(), 768 * KIB, 2).expect("runs");
    for r in &rows {
        // Sharing the NICs slows the Reduce-Scatter down.
        assert!(r.reduce_scatter_ns > r.reduce_scatter_alone_ns, "{r:?}");
    }
    insta::assert_snapshot!(study::concurrent_markdown(&rows));
}
