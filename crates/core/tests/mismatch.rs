//! Ranks that post an operation with different shapes (kind, root, sizes: an erroneous
//! program) all fail it with `ShapeMismatch` at the barrier, long before the peer timeout and
//! before any chunk moves, and the next operation, on which they agree, completes.

mod util;

use ringcast_core::{OpError, Rank};
use util::{Net, Outcome, Start};

const LEN: u64 = 64 << 10;
/// The network's peer timeout (1 ms) in its nanoseconds.
const TIMEOUT_NS: u64 = 1_000_000;

/// Starts operation 0 with `shape(rank)` on every rank, rank `r` at `r * skew` ns (with a
/// skew, `Ready`s reach ranks that have not started the operation yet), then an agreed
/// Broadcast; returns the network after the run.
fn run(shape: impl Fn(u32) -> Start, skew: u64, hub_last: bool) -> Net {
    let mut net = Net::new(4, |_| {});
    net.trace = Some(String::new());
    for r in 0..4u32 {
        let at = skew * u64::from(if hub_last { 3 - r } else { r });
        net.start_rank(at, r, shape(r));
    }
    net.broadcast_at(10 * TIMEOUT_NS, 0, 0, LEN);
    net.run(100_000);
    net
}

fn assert_mismatch(net: &Net, peer: u32, reported_by: u32) {
    let trace = net.trace.as_deref().unwrap_or_default();
    assert!(net.errors.is_empty(), "{:?}", net.errors);
    for r in 0..4 {
        match net.outcome(r, 0) {
            Outcome::Failed(OpError::ShapeMismatch {
                peer: p,
                reported_by: b,
            }) => {
                // The reporter saw it first-hand; every other rank was told by it.
                assert_eq!((p, b), (Rank(peer), Rank(reported_by)), "r{r}\n{trace}");
            }
            other => panic!("r{r}: {other:?}\n{trace}"),
        }
        assert!(
            matches!(net.outcome(r, 1), Outcome::Completed(_)),
            "r{r}: the next operation: {:?}\n{trace}",
            net.outcome(r, 1)
        );
    }
    // Failed at the barrier: no chunk of operation 0 was ever sent, and well before anyone
    // could time out.
    assert!(!trace.contains("Go { op: 0 }"), "{trace}");
    let failed_at = trace
        .lines()
        .filter(|l| l.contains("Failed { op: OpId(0)"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .max()
        .expect("failures in the trace");
    assert!(
        failed_at < TIMEOUT_NS / 2,
        "failed at {failed_at} ns\n{trace}"
    );
}

#[test]
fn a_length_that_differs_fails_everywhere_at_the_barrier() {
    for (skew, hub_last) in [(0, false), (3_000, false), (3_000, true)] {
        let net = run(
            |r| Start::Broadcast {
                root: 0,
                len: if r == 2 { 2 * LEN } else { LEN },
            },
            skew,
            hub_last,
        );
        assert_mismatch(&net, 2, 0);
    }
}

#[test]
fn a_rank_that_takes_another_root_is_caught_where_its_ready_lands() {
    // Rank 3 believes rank 1 is the root: its `Ready` reaches rank 1, which is no hub.
    for (skew, hub_last) in [(0, false), (3_000, true)] {
        let net = run(
            |r| Start::Broadcast {
                root: if r == 3 { 1 } else { 0 },
                len: LEN,
            },
            skew,
            hub_last,
        );
        assert_mismatch(&net, 3, 1);
    }
}

#[test]
fn a_broadcast_and_an_allgather_do_not_meet() {
    // Both gather at rank 0: rank 1's Allgather `Ready` tells it apart.
    let net = run(
        |r| {
            if r == 1 {
                Start::Allgather {
                    sizes: vec![LEN / 4; 4],
                }
            } else {
                Start::Broadcast { root: 0, len: LEN }
            }
        },
        0,
        false,
    );
    assert_mismatch(&net, 1, 0);
    // Allgathervs whose counts differ at one rank.
    let net = run(
        |r| Start::Allgather {
            sizes: if r == 3 {
                vec![LEN, 0, LEN, LEN]
            } else {
                vec![LEN, LEN, 0, LEN]
            },
        },
        0,
        false,
    );
    assert_mismatch(&net, 3, 0);
}

/// A rank that believes itself the root sends no `Ready` and expects them all: as a hub
/// other than rank 0 it sends its witness to rank 0, the true hub, which compares it.
#[test]
fn a_rank_that_takes_itself_for_the_root_is_caught_by_its_witness() {
    let net = run(
        |r| Start::Broadcast {
            root: if r == 1 { 1 } else { 0 },
            len: LEN,
        },
        0,
        false,
    );
    assert_mismatch(&net, 1, 0);
    // Two groups, each with its own root: ranks 0 and 1 name rank 0, ranks 2 and 3 rank 2.
    // Every `Ready` reaches a hub of its own shape; only rank 2's witness crosses over.
    for (skew, hub_last) in [(0, false), (3_000, false), (3_000, true)] {
        let net = run(
            |r| Start::Broadcast {
                root: if r < 2 { 0 } else { 2 },
                len: LEN,
            },
            skew,
            hub_last,
        );
        assert_mismatch(&net, 2, 0);
    }
}

/// The witness of an agreed Broadcast from another root than rank 0 is expected there: the
/// operation completes and rank 0 counts nothing unexpected.
#[test]
fn the_witness_of_an_agreed_operation_is_no_mismatch() {
    for (skew, hub_last) in [(0, false), (3_000, false), (3_000, true)] {
        let net = run(|_| Start::Broadcast { root: 3, len: LEN }, skew, hub_last);
        net.assert_all_completed();
        let s = net.sessions[0].stats();
        assert_eq!((s.control_unexpected, s.control_stale), (0, 0), "{s:?}");
    }
}

/// An operation empty at one rank and not at the others: the empty one completes at once but
/// still says `Ready`, which the hub compares (rank 2 empty), or the empty hub compares the
/// `Ready`s that come after it completed and tells every rank (rank 0 empty). Either way the
/// others fail at once, and the next operation completes.
#[test]
fn an_operation_empty_at_one_rank_fails_at_once_elsewhere() {
    for empty in [2u32, 0] {
        let net = run(
            |r| Start::Broadcast {
                root: 0,
                len: if r == empty { 0 } else { LEN },
            },
            0,
            false,
        );
        let trace = net.trace.as_deref().unwrap_or_default();
        assert!(net.errors.is_empty(), "{:?}", net.errors);
        for r in 0..4 {
            let o = net.outcome(r, 0);
            if r == empty {
                assert!(matches!(o, Outcome::Completed(_)), "r{r}: {o:?}\n{trace}");
            } else {
                // Rank 2's `Ready` reached the hub; the empty hub names the first `Ready` it
                // got after completing, rank 1's.
                let (peer, by) = if empty == 2 { (2, 0) } else { (1, 0) };
                assert_eq!(
                    o,
                    Outcome::Failed(OpError::ShapeMismatch {
                        peer: Rank(peer),
                        reported_by: Rank(by)
                    }),
                    "r{r}\n{trace}"
                );
            }
            assert!(
                matches!(net.outcome(r, 1), Outcome::Completed(_)),
                "r{r}\n{trace}"
            );
        }
        assert!(!trace.contains("Go { op: 0 }"), "{trace}");
    }
}

/// Where every rank agrees an operation is empty, the `Ready`s that still go out are expected
/// and counted nowhere.
#[test]
fn the_readys_of_an_agreed_empty_operation_are_no_mismatch() {
    for root in [0, 2] {
        let mut net = Net::new(4, |_| {});
        net.broadcast_at(0, 1_000, root, 0);
        net.allgather_at(10_000, 1_000, vec![0; 4]);
        net.broadcast_at(20_000, 0, root, LEN);
        net.run(100_000);
        net.assert_all_completed();
        for r in 0..4 {
            let s = net.sessions[r].stats();
            assert_eq!(
                (s.control_unexpected, s.control_stale),
                (0, 0),
                "r{r}: {s:?}"
            );
        }
    }
}
