//! Fabric topologies as a generic graph of hosts and switches joined by leveled, directed links.
//!
//! Nodes `0..hosts` are the hosts (rank `r` is host `r`); switches follow. Every cable is two
//! directed links, one going up (towards the cores/spines) and one going down, and carries a
//! **level**: 0 is host-switch, 1 the next tier up, and so on ([`Topology::level_name`]).
//!
//! Shapes ([`TopologySpec`], built in `build.rs`): a single-switch star, a two-level leaf/spine
//! (the 188-host testbed is one, [`TopologySpec::testbed`]) and a three-level k-ary fat tree,
//! possibly partly filled ([`TopologySpec::FatTree`]).
//!
//! Routing (in `route.rs`) is up/down on any such leveled graph: a breadth-first search that
//! explores down-links first and up-links rotated by a hash of a key and the node, so the
//! choice among equal-cost up-links is deterministic and spread over keys. A multicast tree
//! from a source therefore climbs to one top switch picked by the hash of its key (the
//! multicast group: root and lane) and comes down to every member; a unicast path climbs only
//! as high as the two hosts' lowest common tier.
//!
//! API for the simulator and the baselines (all `pub(crate)`, stable):
//! * [`Topology::build`], the fields `hosts`, `nodes`, `edges` ([`Edge`]: `from`, `to`,
//!   `level`, `up`), [`Topology::levels`], [`Topology::level_name`], [`Topology::name`];
//! * [`Topology::multicast_tree`] (preorder [`TreeStep`]s with subtree skips);
//! * [`Topology::bfs`] + [`Topology::path`], or [`Topology::unicast_path`], for unicast routes.

mod build;
mod route;

pub(crate) use route::TreeStep;

use serde::Serialize;
use std::fmt;

/// Index of a node (host or switch).
pub(crate) type NodeId = u32;
/// Index of a directed link.
pub(crate) type LinkId = u32;
/// "No link" in parent arrays.
pub(crate) const NO_LINK: LinkId = u32::MAX;

/// Which fabric to build.
///
/// ```
/// use ringcast_loopback_sim::TopologySpec;
/// // The paper's 1024-node model: radix-32 switches, the first 4 pods filled.
/// let t = TopologySpec::FatTree { radix: 32, hosts: 1024 };
/// assert_eq!(t.hosts(), 1024);
/// assert_eq!(TopologySpec::full_fat_tree(4).hosts(), 16);
/// assert_eq!(TopologySpec::testbed().hosts(), 188);
/// ```
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
    /// A three-level k-ary fat tree of `radix`-port switches (k = `radix`, even): pods of k/2
    /// edge and k/2 aggregation switches, (k/2)^2 core switches, up to k^3/4 hosts.
    ///
    /// Hosts fill it in order: host `h` sits on edge switch `h / (k/2)` (numbered across pods),
    /// in pod `h / (k^2/4)`. Only pods and edge switches that hold a host are built; a built
    /// pod has all k/2 aggregation switches, and all (k/2)^2 cores are built when there are
    /// two pods or more (one pod needs none). Edge `e` of a pod is cabled to every aggregation
    /// switch of its pod; aggregation switch `a` of every pod is cabled to cores
    /// `a*k/2 .. (a+1)*k/2`. So `radix: 32, hosts: 1024` is 4 full pods of 16 edges x 16 hosts
    /// under 256 cores (the paper's 1024-node model), and a full tree (`hosts: k^3/4`) is the
    /// textbook one.
    FatTree {
        /// Ports per switch (k), even, at least 2 and at most [`TopologySpec::MAX_RADIX`].
        radix: u32,
        /// Hosts (= ranks), at most k^3/4.
        hosts: u32,
    },
}

impl TopologySpec {
    /// Most hosts a topology may have: the core's rank limit (`Limits::max_ranks`).
    pub const MAX_HOSTS: u32 = 1 << 16;

    /// Largest fat-tree radix: a radix-1024 tree already seats 2^28 hosts.
    pub const MAX_RADIX: u32 = 1024;

    /// Most leaf-spine cables (leaves x spines): a fabric is built and routed in memory.
    pub const MAX_SWITCH_CABLES: u64 = 1 << 20;

    /// Number of hosts (ranks).
    pub fn hosts(&self) -> u32 {
        match *self {
            TopologySpec::Star { hosts }
            | TopologySpec::LeafSpine { hosts, .. }
            | TopologySpec::FatTree { hosts, .. } => hosts,
        }
    }

    /// A full k-ary fat tree: `k^3/4` hosts.
    pub fn full_fat_tree(radix: u32) -> Self {
        TopologySpec::FatTree {
            radix,
            hosts: radix.saturating_mul(radix).saturating_mul(radix) / 4,
        }
    }

    /// The 188-host testbed: two levels, 18 switches = 12 leaves + 6 spines, 16 hosts per leaf
    /// (11 full leaves and a 12th with 12 hosts), every leaf cabled to every spine.
    ///
    /// Why this split: 18 switches with one spine per two leaves is the usual 2:1 leaf/spine
    /// ratio, 12 leaves x 16 ports is the smallest power-of-two host count per leaf that seats
    /// 188 hosts, and each leaf then uses 16 + 6 = 22 ports (16:6 oversubscribed uplinks).
    pub const fn testbed() -> Self {
        TopologySpec::LeafSpine {
            hosts: 188,
            hosts_per_leaf: 16,
            spines: 6,
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
            TopologySpec::FatTree { radix, hosts } => {
                let half = u64::from((radix / 2).max(1));
                let pods = u64::from(hosts).div_ceil(half * half);
                write!(
                    f,
                    "fat-tree (radix {radix}, {hosts} hosts, {pods} pods, {} edges, {} cores)",
                    u64::from(hosts).div_ceil(half),
                    if pods > 1 { half * half } else { 0 }
                )
            }
        }
    }
}

/// A directed link of the graph (its dynamic state lives in [`crate::link::Link`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Edge {
    pub(crate) from: NodeId,
    pub(crate) to: NodeId,
    /// Level of the cable: 0 host-switch, 1 the tier above, ... ([`Topology::level_name`]).
    pub(crate) level: u8,
    /// Whether the link goes up (towards higher levels).
    pub(crate) up: bool,
}

/// The static graph.
#[derive(Clone, Debug)]
pub(crate) struct Topology {
    /// Hosts: nodes `0..hosts`.
    pub(crate) hosts: u32,
    /// Hosts and switches.
    pub(crate) nodes: u32,
    /// Directed links; a cable is links `2i` (up) and `2i + 1` (down).
    pub(crate) edges: Vec<Edge>,
    /// Outgoing down-links per node, in construction order.
    down: Vec<Vec<LinkId>>,
    /// Outgoing up-links per node, in construction order.
    up: Vec<Vec<LinkId>>,
    /// Names of nodes, for reports.
    names: Vec<String>,
    /// Names of cable levels, for reports.
    level_names: &'static [&'static str],
}

/// Why a topology could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopologyError {
    /// No hosts.
    NoHosts,
    /// A leaf/spine fabric needs at least one host per leaf and one spine.
    BadShape,
    /// A fat tree needs an even radix of at least 2 and at most
    /// [`TopologySpec::MAX_RADIX`], and at most radix^3/4 hosts.
    BadFatTree,
    /// More than [`TopologySpec::MAX_HOSTS`] hosts, or more than
    /// [`TopologySpec::MAX_SWITCH_CABLES`] leaf-spine cables.
    TooLarge,
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::NoHosts => f.write_str("a topology needs at least one host"),
            TopologyError::BadShape => {
                f.write_str("leaf-spine needs at least one host per leaf and one spine")
            }
            TopologyError::BadFatTree => write!(
                f,
                "a fat tree needs an even radix k, 2 <= k <= {}, and at most k^3/4 hosts \
                 (k = 32: 8192)",
                TopologySpec::MAX_RADIX
            ),
            TopologyError::TooLarge => write!(
                f,
                "a topology has at most {} hosts and {} leaf-spine cables",
                TopologySpec::MAX_HOSTS,
                TopologySpec::MAX_SWITCH_CABLES
            ),
        }
    }
}

impl std::error::Error for TopologyError {}

impl Topology {
    fn empty(hosts: u32, level_names: &'static [&'static str]) -> Self {
        Topology {
            hosts,
            nodes: hosts,
            edges: Vec::new(),
            down: vec![Vec::new(); hosts as usize],
            up: vec![Vec::new(); hosts as usize],
            names: (0..hosts).map(|h| format!("h{h}")).collect(),
            level_names,
        }
    }

    fn add_switch(&mut self, name: String) -> NodeId {
        let id = self.nodes;
        self.nodes += 1;
        self.names.push(name);
        self.down.push(Vec::new());
        self.up.push(Vec::new());
        id
    }

    /// A cable between `lower` and `upper` (one level above): an up-link and a down-link.
    fn cable(&mut self, lower: NodeId, upper: NodeId, level: u8) {
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

    /// A node's name for reports (`h3`, `leaf0`, `spine1`, `sw`, `p0e1`, `p0a2`, `core5`).
    pub(crate) fn name(&self, n: NodeId) -> &str {
        &self.names[n as usize]
    }

    /// Number of cable levels (1 for a star, 2 for leaf/spine, 3 for a fat tree).
    pub(crate) fn levels(&self) -> u8 {
        self.level_names.len() as u8
    }

    /// The name of cable level `level`: `host-edge`, `edge-agg`, `agg-core` for a fat tree,
    /// `host-leaf`, `leaf-spine` for leaf/spine, `host-switch` for a star.
    pub(crate) fn level_name(&self, level: u8) -> &'static str {
        self.level_names
            .get(usize::from(level))
            .copied()
            .unwrap_or("?")
    }
}
