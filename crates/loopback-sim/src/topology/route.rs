//! Up/down routing: breadth-first trees, unicast paths and multicast trees.

use super::{LinkId, NO_LINK, NodeId, Topology};
use crate::rng::splitmix64;

/// One step of a multicast tree in depth-first preorder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TreeStep {
    pub(crate) link: LinkId,
    /// Depth of the link's source node (the root host is depth 0).
    pub(crate) depth: u16,
    /// The host this link delivers to, or `u32::MAX` for a switch.
    pub(crate) host: u32,
    /// Index just past this step's subtree: where to continue when the packet is lost here.
    pub(crate) skip: u32,
}

impl Topology {
    /// Breadth-first tree from `src`: the link each node is reached by (`NO_LINK` for `src`
    /// and unreachable nodes), and the nodes in visiting order. Down-links are tried first;
    /// up-links rotated by a hash of `key` and the node, so that different keys spread over
    /// equal-cost paths and the choices at successive tiers are independent (a fat tree's
    /// multicast groups spread over all cores, not one diagonal).
    pub(crate) fn bfs(&self, src: NodeId, key: u64) -> (Vec<LinkId>, Vec<NodeId>) {
        let n = self.nodes as usize;
        let mut parent = vec![NO_LINK; n];
        let mut seen = vec![false; n];
        let mut order = Vec::with_capacity(n);
        seen[src as usize] = true;
        order.push(src);
        let mut head = 0;
        while head < order.len() {
            let u = order[head] as usize;
            head += 1;
            let ups = &self.up[u];
            let rot = if ups.is_empty() {
                0
            } else {
                (splitmix64(key ^ (u as u64).rotate_left(40)) % ups.len() as u64) as usize
            };
            let rotated = ups[rot..].iter().chain(&ups[..rot]);
            for &l in self.down[u].iter().chain(rotated) {
                let v = self.edges[l as usize].to as usize;
                if !seen[v] {
                    seen[v] = true;
                    parent[v] = l;
                    order.push(v as NodeId);
                }
            }
        }
        (parent, order)
    }

    /// The links from `src` to `dst` along `parent` (a [`bfs`](Self::bfs) tree from `src`).
    pub(crate) fn path(&self, parent: &[LinkId], dst: NodeId, out: &mut Vec<LinkId>) {
        out.clear();
        let mut v = dst;
        while parent[v as usize] != NO_LINK {
            let l = parent[v as usize];
            out.push(l);
            v = self.edges[l as usize].from;
        }
        out.reverse();
    }

    /// The unicast up/down path from `src` to `dst` (links in order), routed with key `src`
    /// as the simulator routes reads and control messages. Allocates; for hot loops keep a
    /// [`bfs`](Self::bfs) tree per source and call [`path`](Self::path).
    #[allow(dead_code)] // API for the baselines (ring, k-nomial, chain) and tests
    pub(crate) fn unicast_path(&self, src: NodeId, dst: NodeId) -> Vec<LinkId> {
        let (parent, _) = self.bfs(src, u64::from(src));
        let mut out = Vec::new();
        self.path(&parent, dst, &mut out);
        out
    }

    /// The multicast tree from host `root` to every other host, in depth-first preorder,
    /// with branches that reach no host pruned. `key` picks among equal-cost up-links.
    pub(crate) fn multicast_tree(&self, root: NodeId, key: u64) -> Vec<TreeStep> {
        let (parent, order) = self.bfs(root, key);
        let n = self.nodes as usize;
        // Count hosts below every node (reverse BFS order visits children before parents).
        let mut below = vec![0u32; n];
        for &v in order.iter().rev() {
            if v < self.hosts && v != root {
                below[v as usize] += 1;
            }
            let l = parent[v as usize];
            if l != NO_LINK {
                let p = self.edges[l as usize].from as usize;
                below[p] += below[v as usize];
            }
        }
        let mut children: Vec<Vec<LinkId>> = vec![Vec::new(); n];
        for &v in &order {
            let l = parent[v as usize];
            if l != NO_LINK && below[v as usize] > 0 {
                children[self.edges[l as usize].from as usize].push(l);
            }
        }
        let mut steps = Vec::new();
        self.preorder(root, 0, &children, &mut steps);
        steps
    }

    fn preorder(&self, u: NodeId, depth: u16, children: &[Vec<LinkId>], out: &mut Vec<TreeStep>) {
        for &l in &children[u as usize] {
            let v = self.edges[l as usize].to;
            let i = out.len();
            out.push(TreeStep {
                link: l,
                depth,
                host: if v < self.hosts { v } else { u32::MAX },
                skip: 0,
            });
            self.preorder(v, depth + 1, children, out);
            out[i].skip = out.len() as u32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TopologySpec;
    use std::collections::BTreeSet;

    fn hosts_of(t: &Topology, steps: &[TreeStep]) -> Vec<u32> {
        let mut h: Vec<u32> = steps
            .iter()
            .filter(|s| s.host != u32::MAX)
            .map(|s| s.host)
            .collect();
        h.sort_unstable();
        let _ = t;
        h
    }

    #[test]
    fn star_tree_reaches_every_other_host_once() {
        let t = Topology::build(&TopologySpec::Star { hosts: 5 }).unwrap();
        let steps = t.multicast_tree(2, 0);
        assert_eq!(hosts_of(&t, &steps), [0, 1, 3, 4]);
        assert_eq!(steps.len(), 5); // uplink + 4 downlinks
        assert_eq!(steps[0].skip, 5);
    }

    #[test]
    fn leaf_spine_tree_uses_one_spine_and_every_leaf_once() {
        let spec = TopologySpec::LeafSpine {
            hosts: 10,
            hosts_per_leaf: 4,
            spines: 3,
        };
        let t = Topology::build(&spec).unwrap();
        for key in 0..3 {
            let steps = t.multicast_tree(5, key);
            let want: Vec<u32> = (0..10).filter(|h| *h != 5).collect();
            assert_eq!(hosts_of(&t, &steps), want);
            let spines: std::collections::BTreeSet<_> = steps
                .iter()
                .map(|s| t.edges[s.link as usize])
                .filter(|e| e.level == 1 && e.up)
                .map(|e| e.to)
                .collect();
            assert_eq!(spines.len(), 1, "one spine per tree");
            // uplink, 3 local downlinks, leaf->spine, 2 x (spine->leaf + hosts)
            assert_eq!(steps.len(), 1 + 3 + 1 + (1 + 4) + (1 + 2));
        }
    }

    #[test]
    fn unicast_path_goes_up_and_down() {
        let spec = TopologySpec::LeafSpine {
            hosts: 8,
            hosts_per_leaf: 4,
            spines: 2,
        };
        let t = Topology::build(&spec).unwrap();
        let (parent, _) = t.bfs(0, 0);
        let mut p = Vec::new();
        t.path(&parent, 1, &mut p);
        assert_eq!(p.len(), 2);
        t.path(&parent, 7, &mut p);
        assert_eq!(p.len(), 4);
        assert_eq!(t.edges[p[3] as usize].to, 7);
    }

    fn k8_half() -> Topology {
        // 4 of 8 pods filled: 64 hosts, 16 edges, 16 aggs, 16 cores.
        Topology::build(&TopologySpec::FatTree {
            radix: 8,
            hosts: 64,
        })
        .unwrap()
    }

    #[test]
    fn fat_tree_multicast_climbs_to_one_core_and_crosses_each_link_once() {
        let t = k8_half();
        let mut cores = BTreeSet::new();
        for key in 0..32 {
            let steps = t.multicast_tree(9, key);
            let want: Vec<u32> = (0..64).filter(|h| *h != 9).collect();
            assert_eq!(hosts_of(&t, &steps), want);
            let links: BTreeSet<_> = steps.iter().map(|s| s.link).collect();
            assert_eq!(links.len(), steps.len(), "a link used twice");
            let up_core: Vec<_> = steps
                .iter()
                .map(|s| t.edges[s.link as usize])
                .filter(|e| e.level == 2 && e.up)
                .map(|e| e.to)
                .collect();
            assert_eq!(up_core.len(), 1, "one core per tree");
            cores.insert(up_core[0]);
            // host->edge, 3 local hosts, edge->agg, 3 edges + 12 hosts in the pod,
            // agg->core, 3 x (core->agg, 4 x (agg->edge + 4 hosts)).
            assert_eq!(steps.len(), 1 + 3 + 1 + 3 + 12 + 1 + 3 * (1 + 4 * 5));
        }
        assert!(cores.len() >= 8, "groups spread over the cores: {cores:?}");
    }

    #[test]
    fn fat_tree_unicast_paths_climb_only_as_needed() {
        let t = k8_half();
        assert_eq!(t.unicast_path(0, 3).len(), 2); // same edge
        assert_eq!(t.unicast_path(0, 4).len(), 4); // same pod
        let p = t.unicast_path(0, 63);
        assert_eq!(p.len(), 6); // across pods, through a core
        assert_eq!(t.edges[p[5] as usize].to, 63);
    }
}
