//! Fabric topologies as a generic graph of hosts and switches joined by leveled, directed links.
//!
//! Nodes `0..hosts` are the hosts (rank `r` is host `r`); switches follow. Every cable is two
//! directed links, one going up (towards the spines) and one going down. Routing is up/down:
//! a breadth-first search that explores down-links in order and up-links rotated by a key, so
//! the choice among equal-cost up-links is deterministic and spread over keys (roots, lanes,
//! pairs). Any leveled graph (a 3-level k-ary fat tree too) routes the same way.

use serde::Serialize;
use std::fmt;

/// Index of a node (host or switch).
pub(crate) type NodeId = u32;
/// Index of a directed link.
pub(crate) type LinkId = u32;
/// "No link" in parent arrays.
pub(crate) const NO_LINK: LinkId = u32::MAX;

/// Which fabric to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum TopologySpec {
    /// Every host on one switch.
    Star {
        /// Hosts (= ranks).
        hosts: u32,
    },
    /// Two levels: hosts under leaf switches, every leaf cabled to every spine.
    LeafSpine {
        /// Hosts (= ranks); the last leaf may be partly filled.
        hosts: u32,
        /// Hosts under each leaf switch.
        hosts_per_leaf: u32,
        /// Spine switches.
        spines: u32,
    },
}

impl TopologySpec {
    /// Number of hosts (ranks).
    pub fn hosts(&self) -> u32 {
        match *self {
            TopologySpec::Star { hosts } | TopologySpec::LeafSpine { hosts, .. } => hosts,
        }
    }
}

impl fmt::Display for TopologySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TopologySpec::Star { hosts } => write!(f, "star ({hosts} hosts)"),
            TopologySpec::LeafSpine {
                hosts,
                hosts_per_leaf,
                spines,
            } => write!(
                f,
                "leaf-spine ({hosts} hosts, {} leaves of {hosts_per_leaf}, {spines} spines)",
                hosts.div_ceil(hosts_per_leaf.max(1))
            ),
        }
    }
}

/// A directed link of the graph (its dynamic state lives in [`crate::link::Link`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edge {
    pub(crate) from: NodeId,
    pub(crate) to: NodeId,
    /// Level of the cable: 0 host-leaf, 1 leaf-spine, ...
    pub(crate) level: u8,
    /// Whether the link goes up (towards higher levels).
    pub(crate) up: bool,
}

/// The static graph.
#[derive(Clone, Debug)]
pub(crate) struct Topology {
    pub(crate) hosts: u32,
    pub(crate) nodes: u32,
    pub(crate) edges: Vec<Edge>,
    /// Outgoing down-links per node, in construction order.
    down: Vec<Vec<LinkId>>,
    /// Outgoing up-links per node, in construction order.
    up: Vec<Vec<LinkId>>,
    /// Names of nodes, for reports.
    names: Vec<String>,
}

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

/// Why a topology could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologyError {
    /// No hosts.
    NoHosts,
    /// A leaf/spine fabric needs at least one host per leaf and one spine.
    BadShape,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::NoHosts => f.write_str("a topology needs at least one host"),
            TopologyError::BadShape => {
                f.write_str("leaf-spine needs at least one host per leaf and one spine")
            }
        }
    }
}

impl std::error::Error for TopologyError {}

impl Topology {
    /// Builds the graph for `spec`.
    pub(crate) fn build(spec: &TopologySpec) -> Result<Self, TopologyError> {
        let hosts = spec.hosts();
        if hosts == 0 {
            return Err(TopologyError::NoHosts);
        }
        let mut t = Topology {
            hosts,
            nodes: hosts,
            edges: Vec::new(),
            down: Vec::new(),
            up: Vec::new(),
            names: (0..hosts).map(|h| format!("h{h}")).collect(),
        };
        match *spec {
            TopologySpec::Star { .. } => {
                let sw = t.add_switch("sw".into());
                for h in 0..hosts {
                    t.cable(h, sw, 0);
                }
            }
            TopologySpec::LeafSpine {
                hosts_per_leaf,
                spines,
                ..
            } => {
                if hosts_per_leaf == 0 || spines == 0 {
                    return Err(TopologyError::BadShape);
                }
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
            }
        }
        Ok(t)
    }

    fn add_switch(&mut self, name: String) -> NodeId {
        let id = self.nodes;
        self.nodes += 1;
        self.names.push(name);
        id
    }

    /// A cable between `lower` and `upper` (one level above): an up-link and a down-link.
    fn cable(&mut self, lower: NodeId, upper: NodeId, level: u8) {
        let n = self.nodes as usize;
        self.down.resize_with(n, Vec::new);
        self.up.resize_with(n, Vec::new);
        let id = self.edges.len() as LinkId;
        self.edges.push(Edge {
            from: lower,
            to: upper,
            level,
            up: true,
        });
        self.edges.push(Edge {
            from: upper,
            to: lower,
            level,
            up: false,
        });
        self.up[lower as usize].push(id);
        self.down[upper as usize].push(id + 1);
    }

    /// A node's name for reports (`h3`, `leaf0`, `spine1`, `sw`).
    pub(crate) fn name(&self, n: NodeId) -> &str {
        &self.names[n as usize]
    }

    /// Breadth-first tree from `src`: the link each node is reached by (`NO_LINK` for `src`
    /// and unreachable nodes), and the nodes in visiting order. Up-links are tried rotated by
    /// `key` so different keys spread over equal-cost paths.
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
                (key % ups.len() as u64) as usize
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
}
