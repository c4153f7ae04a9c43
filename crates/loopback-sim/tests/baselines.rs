//! The baselines: exact traffic, round structure, loss recovery, determinism.

use ringcast_loopback_sim::baselines::{
    self, Baseline, BaselineConfig, BaselineOp, BaselineReport, Forwarding,
};
use ringcast_loopback_sim::{Faults, SimConfig, TopologySpec, Workload};
use std::time::Duration;

const KIB: u64 = 1024;

fn one(topology: TopologySpec, a: Baseline, loss: f64, seed: u64) -> BaselineReport {
    let mut cfg = BaselineConfig::one(topology, a);
    cfg.faults = Faults {
        loss,
        ..Faults::default()
    };
    cfg.seed = seed;
    let mut r = baselines::run(&cfg).expect("valid config");
    r.remove(0)
}

fn star(hosts: u32) -> TopologySpec {
    TopologySpec::Star { hosts }
}

/// Serialization of `bytes` at 100 Gbit/s, in ns.
fn ser_ns(bytes: u64) -> u64 {
    bytes * 8 / 100
}

#[test]
fn ring_allgather_moves_p_times_p_minus_1_blocks() {
    for (p, n) in [(2u32, 4 * KIB), (8, 64 * KIB), (13, 10_000)] {
        let r = one(star(p), Baseline::RingAllgather { len: n }, 0.0, 0);
        assert!(r.completed, "{r:?}");
        let p = u64::from(p);
        let sent: u64 = r.per_rank.iter().map(|x| x.sent).sum();
        assert_eq!(sent, p * (p - 1) * n);
        // Every packet crosses a host's up-link and a switch's down-link.
        assert_eq!(r.level("host-switch"), 2 * p * (p - 1) * n);
        assert!(r.per_rank.iter().all(|x| x.sent == (p - 1) * n));
        assert!(r.per_rank.iter().all(|x| x.received == (p - 1) * n));
        assert_eq!((r.lost, r.retransmissions), (0, 0));
        // Line rate on every NIC: (P-1) N / B plus a little pipeline fill.
        let floor = ser_ns((p - 1) * n);
        assert!(r.completion_ns >= floor, "{} < {floor}", r.completion_ns);
        // ... and the last block's P - 1 hops of pipeline fill (two links per hop).
        let fill = (p - 1) * 2 * (ser_ns(4 * KIB) + 500);
        assert!(r.completion_ns <= floor + fill, "{}", r.completion_ns);
    }
}

#[test]
fn ring_reduce_scatter_moves_blocks_of_n_over_p() {
    let (p, n) = (8u64, 64 * KIB);
    let r = one(star(8), Baseline::RingReduceScatter { len: n }, 0.0, 0);
    assert!(r.completed);
    assert_eq!(r.level("host-switch"), 2 * p * (p - 1) * (n / p));
}

#[test]
fn binomial_store_and_forward_takes_ceil_log2_p_rounds() {
    let n = 64 * KIB;
    for p in [2u32, 5, 8, 16, 33] {
        let a = Baseline::Binomial {
            root: p / 3,
            len: n,
            forwarding: Forwarding::StoreAndForward,
        };
        let r = one(star(p), a, 0.0, 0);
        assert!(r.completed);
        let rounds = u64::from(32 - (p - 1).leading_zeros());
        // One round: the whole message serialized, then the last chunk's second hop and the
        // two links' latency.
        let round = ser_ns(n) + ser_ns(4 * KIB) + 1_000 + 2;
        assert!(
            r.completion_ns <= rounds * round,
            "p {p}: {} > {rounds} rounds",
            r.completion_ns
        );
        assert!(
            r.completion_ns > (rounds - 1) * round,
            "p {p}: {} too fast",
            r.completion_ns
        );
        // A tree sends every byte to every non-root rank exactly once.
        assert_eq!(r.level("host-switch"), 2 * u64::from(p - 1) * n);
    }
}

#[test]
fn knomial_is_a_tree_too() {
    for k in [2, 3, 4, 8] {
        let a = Baseline::KNomial {
            root: 3,
            len: 40 * KIB,
            k,
            forwarding: Forwarding::Pipelined,
        };
        let r = one(star(20), a, 0.0, 0);
        assert!(r.completed);
        assert_eq!(r.level("host-switch"), 2 * 19 * 40 * KIB, "k {k}");
    }
}

#[test]
fn chain_streams_at_line_rate_after_the_fill() {
    let (p, n) = (16u32, 4 * 1024 * KIB);
    let r = one(star(p), Baseline::Chain { root: 0, len: n }, 0.0, 0);
    assert!(r.completed);
    let fill = u64::from(p - 1) * 2 * (ser_ns(4 * KIB) + 500);
    assert!(r.completion_ns >= ser_ns(n));
    assert!(r.completion_ns <= ser_ns(n) + fill, "{}", r.completion_ns);
}

#[test]
fn unicast_losses_are_retransmitted_once_each() {
    let spec = TopologySpec::LeafSpine {
        hosts: 16,
        hosts_per_leaf: 4,
        spines: 2,
    };
    let clean = one(spec, Baseline::RingAllgather { len: 64 * KIB }, 0.0, 1);
    let r = one(spec, Baseline::RingAllgather { len: 64 * KIB }, 1e-3, 1);
    assert!(r.completed);
    assert!(r.lost > 0);
    assert_eq!(r.retransmissions, r.lost);
    assert!(r.total_link_bytes > clean.total_link_bytes);
    assert!(r.completion_ns > clean.completion_ns);
}

#[test]
fn go_back_n_recovers_every_loss_and_pays_bytes_for_it() {
    let spec = TopologySpec::LeafSpine {
        hosts: 32,
        hosts_per_leaf: 8,
        spines: 2,
    };
    let a = Baseline::GoBackNMulticast {
        root: 5,
        len: 4 * 1024 * KIB,
    };
    let clean = one(spec, a, 0.0, 3);
    assert!(clean.completed);
    assert_eq!((clean.retransmissions, clean.timeouts), (0, 0));
    // Multicast: every link of the tree carries every byte once.
    let tree_links = 1 + 7 + 1 + 3 * (1 + 8);
    assert_eq!(clean.total_link_bytes, tree_links * 4 * 1024 * KIB);
    let mut last = clean.total_link_bytes;
    for loss in [1e-4, 1e-3, 1e-2] {
        let r = one(spec, a, loss, 3);
        assert!(r.completed, "loss {loss}: {r:?}");
        assert!(r.lost > 0 && r.retransmissions > 0, "loss {loss}");
        assert!(r.total_link_bytes > last, "loss {loss}");
        assert!(
            r.per_rank
                .iter()
                .all(|x| x.rank == 5 || x.received >= 4 * 1024 * KIB)
        );
        last = r.total_link_bytes;
    }
}

#[test]
fn same_seed_same_report() {
    let spec = TopologySpec::FatTree {
        radix: 4,
        hosts: 16,
    };
    for a in [
        Baseline::RingAllgather { len: 20 * KIB },
        Baseline::GoBackNMulticast {
            root: 0,
            len: 256 * KIB,
        },
    ] {
        let x = one(spec, a, 1e-2, 9);
        assert_eq!(x, one(spec, a, 1e-2, 9));
        assert_ne!(x, one(spec, a, 1e-2, 10));
    }
}

#[test]
fn concurrent_ops_share_the_nics() {
    let n = 256 * KIB;
    let ag = BaselineOp {
        start: Duration::ZERO,
        algorithm: Baseline::RingAllgather { len: n / 8 },
    };
    let rs = BaselineOp {
        start: Duration::ZERO,
        algorithm: Baseline::RingReduceScatter { len: n },
    };
    let alone = baselines::run(&BaselineConfig::new(star(8), vec![rs])).expect("ok");
    let both = baselines::run(&BaselineConfig::new(star(8), vec![ag, rs])).expect("ok");
    assert!(both.iter().all(|r| r.completed));
    // The two rings move the same bytes, so sharing the NICs roughly doubles the time.
    let (a, b) = (alone[0].completion_ns, both[1].completion_ns);
    assert!(b > a * 3 / 2, "{b} vs {a}");
}

#[test]
fn with_sim_both_complete_and_contend() {
    let spec = star(8);
    let n = 256 * KIB;
    let rs = BaselineOp {
        start: Duration::ZERO,
        algorithm: Baseline::RingReduceScatter { len: n },
    };
    let alone = baselines::run(&BaselineConfig::new(spec, vec![rs])).expect("ok");
    // Eight concurrent broadcasts: the injection pattern of a multicast Allgather.
    let mut w = Workload::new();
    for root in 0..8 {
        w = w.broadcast(Duration::ZERO, root, n / 8);
    }
    let (sim, base) = baselines::run_with_sim(SimConfig::new(spec, w), vec![rs]).expect("ok");
    assert!(sim.all_completed(), "{sim}");
    assert!(base[0].completed);
    assert!(base[0].completion_ns > alone[0].completion_ns);
}

#[test]
fn bad_root_is_an_error() {
    let cfg = BaselineConfig::one(star(4), Baseline::Chain { root: 4, len: 1 });
    assert!(baselines::run(&cfg).is_err());
}
