//! Helpers shared by the simulator's integration tests.
#![allow(dead_code, unreachable_pub)]

use ringcast_loopback_sim::{Faults, Outcome, Report, Sim, SimConfig, TopologySpec, Workload};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;

pub fn star(hosts: u32) -> TopologySpec {
    TopologySpec::Star { hosts }
}

pub fn leaf_spine(hosts: u32, hosts_per_leaf: u32, spines: u32) -> TopologySpec {
    TopologySpec::LeafSpine {
        hosts,
        hosts_per_leaf,
        spines,
    }
}

/// One broadcast of `len` bytes from `root` at time 0.
pub fn bcast(root: u32, len: u64) -> Workload {
    Workload::new().broadcast(Duration::ZERO, root, len)
}

pub fn run(topology: TopologySpec, workload: Workload, faults: Faults, seed: u64) -> Report {
    let mut cfg = SimConfig::new(topology, workload);
    cfg.seed = seed;
    cfg.faults = faults;
    Sim::new(cfg).expect("valid config").run()
}

/// Everything completed with the root's data.
#[track_caller]
pub fn assert_all_ok(r: &Report) {
    assert!(!r.truncated, "run hit the time limit\n{r}");
    assert!(r.verified, "wrong data\n{r}");
    assert!(r.all_completed(), "not all completed\n{r}");
}

/// Every rank that did not crash either completed with the right data or failed with a typed
/// error naming one of the crashed ranks; nothing hung.
#[track_caller]
pub fn assert_survivors_ok(r: &Report, crashed: &[u32]) {
    assert!(!r.truncated, "run hit the time limit\n{r}");
    assert!(r.verified, "wrong data\n{r}");
    assert!(r.all_finished, "a rank hung\n{r}");
    for rank in &r.per_rank {
        if crashed.contains(&rank.rank) {
            assert!(rank.crashed, "rank {} should have crashed\n{r}", rank.rank);
            continue;
        }
        for o in &rank.outcomes {
            match o {
                Outcome::Completed { mismatches: 0, .. } => {}
                Outcome::Failed { error, .. } => assert!(
                    crashed.contains(&error.peer()),
                    "rank {} blames live rank {}\n{r}",
                    rank.rank,
                    error.peer()
                ),
                other => panic!("rank {}: {other:?}\n{r}", rank.rank),
            }
        }
    }
}
