//! Construction of each [`TopologySpec`] shape as a leveled graph.

use super::{NodeId, Topology, TopologyError, TopologySpec};

impl Topology {
    /// Builds the graph for `spec`.
    pub(crate) fn build(spec: &TopologySpec) -> Result<Self, TopologyError> {
        let hosts = spec.hosts();
        if hosts == 0 {
            return Err(TopologyError::NoHosts);
        }
        // Before anything is allocated per host.
        if hosts > TopologySpec::MAX_HOSTS {
            return Err(TopologyError::TooLarge);
        }
        match *spec {
            TopologySpec::Star { .. } => {
                let mut t = Topology::empty(hosts, &["host-switch"]);
                let sw = t.add_switch("sw".into());
                for h in 0..hosts {
                    t.cable(h, sw, 0);
                }
                Ok(t)
            }
            TopologySpec::LeafSpine {
                hosts_per_leaf,
                spines,
                ..
            } => leaf_spine(hosts, hosts_per_leaf, spines),
            TopologySpec::FatTree { radix, .. } => fat_tree(hosts, radix),
        }
    }
}

fn leaf_spine(hosts: u32, hosts_per_leaf: u32, spines: u32) -> Result<Topology, TopologyError> {
    if hosts_per_leaf == 0 || spines == 0 {
        return Err(TopologyError::BadShape);
    }
    let leaves = hosts.div_ceil(hosts_per_leaf);
    if u64::from(leaves) * u64::from(spines) > TopologySpec::MAX_SWITCH_CABLES {
        return Err(TopologyError::TooLarge);
    }
    let mut t = Topology::empty(hosts, &["host-leaf", "leaf-spine"]);
    let leaf_ids: Vec<NodeId> = (0..leaves)
        .map(|l| t.add_switch(format!("leaf{l}")))
        .collect();
    let spine_ids: Vec<NodeId> = (0..spines)
        .map(|s| t.add_switch(format!("spine{s}")))
        .collect();
    for h in 0..hosts {
        t.cable(h, leaf_ids[(h / hosts_per_leaf) as usize], 0);
    }
    for &l in &leaf_ids {
        for &s in &spine_ids {
            t.cable(l, s, 1);
        }
    }
    Ok(t)
}

/// The partly filled k-ary fat tree documented on [`TopologySpec::FatTree`].
/// Only the pods and edge switches that hold a host are built, and the cores only when there
/// is more than one pod (within a pod, traffic turns at the aggregation switches). The
/// capacity is computed in `u64`; with at most [`TopologySpec::MAX_HOSTS`] hosts and a radix of
/// at most [`TopologySpec::MAX_RADIX`], every switch count then fits a `u32` (cores only with
/// more hosts than cores; aggregation switches at most the edges plus one pod's).
fn fat_tree(hosts: u32, radix: u32) -> Result<Topology, TopologyError> {
    if !(2..=TopologySpec::MAX_RADIX).contains(&radix) || !radix.is_multiple_of(2) {
        return Err(TopologyError::BadFatTree);
    }
    let half = radix / 2;
    let capacity = u64::from(radix).pow(3) / 4; // radix <= 1024: fits
    if u64::from(hosts) > capacity {
        return Err(TopologyError::BadFatTree);
    }
    let mut t = Topology::empty(hosts, &["host-edge", "edge-agg", "agg-core"]);
    let edges = hosts.div_ceil(half);
    let pods = edges.div_ceil(half);
    // pods <= edges <= hosts, and more than one pod holds more than half^2 hosts.
    let cores = if pods > 1 { half * half } else { 0 };
    let edge_ids: Vec<NodeId> = (0..edges)
        .map(|e| t.add_switch(format!("p{}e{}", e / half, e % half)))
        .collect();
    let agg_ids: Vec<NodeId> = (0..pods * half)
        .map(|a| t.add_switch(format!("p{}a{}", a / half, a % half)))
        .collect();
    let core_ids: Vec<NodeId> = (0..cores)
        .map(|c| t.add_switch(format!("core{c}")))
        .collect();
    for h in 0..hosts {
        t.cable(h, edge_ids[(h / half) as usize], 0);
    }
    for (e, &edge) in edge_ids.iter().enumerate() {
        let pod = e / half as usize;
        for &agg in &agg_ids[pod * half as usize..(pod + 1) * half as usize] {
            t.cable(edge, agg, 1);
        }
    }
    if core_ids.is_empty() {
        return Ok(t);
    }
    for (a, &agg) in agg_ids.iter().enumerate() {
        let i = a % half as usize;
        for &core in &core_ids[i * half as usize..(i + 1) * half as usize] {
            t.cable(agg, core, 2);
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(t: &Topology, level: u8) -> usize {
        t.edges.iter().filter(|e| e.level == level && e.up).count()
    }

    #[test]
    fn full_k4_fat_tree_is_the_textbook_one() {
        let t = Topology::build(&TopologySpec::full_fat_tree(4)).unwrap();
        assert_eq!(t.hosts, 16);
        assert_eq!(t.nodes, 16 + 8 + 8 + 4); // hosts, edges, aggs, cores
        assert_eq!((count(&t, 0), count(&t, 1), count(&t, 2)), (16, 16, 16));
        assert_eq!(t.levels(), 3);
        assert_eq!(t.level_name(2), "agg-core");
    }

    #[test]
    fn radix_32_with_1024_hosts_fills_four_pods() {
        let spec = TopologySpec::FatTree {
            radix: 32,
            hosts: 1024,
        };
        let t = Topology::build(&spec).unwrap();
        // 64 edges, 4 pods x 16 aggs, 256 cores.
        assert_eq!(t.nodes, 1024 + 64 + 64 + 256);
        assert_eq!(count(&t, 1), 64 * 16);
        assert_eq!(count(&t, 2), 64 * 16);
        assert_eq!(t.name(1024 + 17), "p1e1");
    }

    #[test]
    fn bad_fat_trees_are_errors() {
        for spec in [
            TopologySpec::FatTree { radix: 3, hosts: 4 },
            TopologySpec::FatTree {
                radix: 4,
                hosts: 17,
            },
            TopologySpec::FatTree { radix: 0, hosts: 1 },
            // `half * half` wrapped in u32 (a panic slicing the cores) ...
            TopologySpec::FatTree {
                radix: 2_097_152,
                hosts: 2,
            },
            // ... and radix^3 in u64 (a wrong capacity); both far above the cap.
            TopologySpec::FatTree {
                radix: u32::MAX - 1,
                hosts: 2,
            },
            TopologySpec::FatTree {
                radix: TopologySpec::MAX_RADIX + 2,
                hosts: 2,
            },
        ] {
            assert_eq!(
                Topology::build(&spec).unwrap_err(),
                TopologyError::BadFatTree
            );
        }
    }

    #[test]
    fn the_largest_radix_builds_only_what_its_hosts_use() {
        // Was 512 aggregation switches and 262144 cores for two hosts.
        let spec = TopologySpec::FatTree {
            radix: TopologySpec::MAX_RADIX,
            hosts: 2,
        };
        let t = Topology::build(&spec).unwrap();
        assert_eq!(t.nodes, 2 + 1 + 512);
        assert_eq!((count(&t, 0), count(&t, 1), count(&t, 2)), (2, 512, 0));
        assert_eq!(t.unicast_path(0, 1).len(), 2);
        // One pod of a radix-8 tree: no cores; a second pod brings all 16.
        let one_pod = TopologySpec::FatTree {
            radix: 8,
            hosts: 16,
        };
        let t = Topology::build(&one_pod).unwrap();
        assert_eq!(t.nodes, 16 + 4 + 4);
        assert_eq!(t.unicast_path(0, 15).len(), 4);
        let two_pods = TopologySpec::FatTree {
            radix: 8,
            hosts: 17,
        };
        assert_eq!(Topology::build(&two_pods).unwrap().nodes, 17 + 5 + 8 + 16);
    }

    #[test]
    fn too_many_hosts_or_cables_are_errors_before_allocating() {
        assert_eq!(
            TopologySpec::MAX_HOSTS,
            ringcast_core::Limits::default().max_ranks
        );
        for spec in [
            TopologySpec::Star { hosts: u32::MAX },
            TopologySpec::Star {
                hosts: TopologySpec::MAX_HOSTS + 1,
            },
            TopologySpec::LeafSpine {
                hosts: 16,
                hosts_per_leaf: 1,
                spines: 100_000_000,
            },
            TopologySpec::FatTree {
                radix: 4,
                hosts: u32::MAX,
            },
        ] {
            assert_eq!(
                Topology::build(&spec).unwrap_err(),
                TopologyError::TooLarge,
                "{spec:?}"
            );
        }
    }

    #[test]
    fn testbed_is_188_hosts_on_18_switches() {
        let t = Topology::build(&TopologySpec::testbed()).unwrap();
        assert_eq!(t.hosts, 188);
        assert_eq!(t.nodes - t.hosts, 18);
        assert_eq!(count(&t, 1), 12 * 6);
    }
}
