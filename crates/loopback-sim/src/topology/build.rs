//! Construction of each [`TopologySpec`] shape as a leveled graph.

use super::{NodeId, Topology, TopologyError, TopologySpec};

impl Topology {
    /// Builds the graph for `spec`.
    pub(crate) fn build(spec: &TopologySpec) -> Result<Self, TopologyError> {
        let hosts = spec.hosts();
        if hosts == 0 {
            return Err(TopologyError::NoHosts);
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
    let mut t = Topology::empty(hosts, &["host-leaf", "leaf-spine"]);
    let leaves = hosts.div_ceil(hosts_per_leaf);
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
fn fat_tree(hosts: u32, radix: u32) -> Result<Topology, TopologyError> {
    let half = radix / 2;
    let capacity = u64::from(radix).pow(3) / 4;
    if radix < 2 || !radix.is_multiple_of(2) || u64::from(hosts) > capacity {
        return Err(TopologyError::BadFatTree);
    }
    let mut t = Topology::empty(hosts, &["host-edge", "edge-agg", "agg-core"]);
    let edges = hosts.div_ceil(half);
    let pods = edges.div_ceil(half);
    let edge_ids: Vec<NodeId> = (0..edges)
        .map(|e| t.add_switch(format!("p{}e{}", e / half, e % half)))
        .collect();
    let agg_ids: Vec<NodeId> = (0..pods * half)
        .map(|a| t.add_switch(format!("p{}a{}", a / half, a % half)))
        .collect();
    let core_ids: Vec<NodeId> = (0..half * half)
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
        ] {
            assert_eq!(
                Topology::build(&spec).unwrap_err(),
                TopologyError::BadFatTree
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
