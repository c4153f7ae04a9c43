//! Multi-rank Broadcast scenarios on the in-process network.

mod util;

use ringcast_core::{OpError, Rank};
use util::{Net, Outcome};

const STEPS: usize = 2_000_000;

#[test]
fn loss_free_broadcast_completes_everywhere() {
    let mut net = Net::new(5, |_| {});
    net.broadcast_at(0, 0, 2, 100_000);
    net.run(STEPS);
    net.assert_all_completed();
    for s in &net.sessions {
        assert_eq!(s.stats().chunks_fetched, 0);
    }
}

#[test]
fn one_leaf_receives_nothing() {
    let mut net = Net::new(6, |_| {});
    net.faults.rules.push(Box::new(|_, _, _, to| to == 3));
    net.broadcast_at(0, 0, 0, 64 * 4096);
    net.run(STEPS);
    net.assert_all_completed();
    assert_eq!(net.sessions[3].stats().chunks_fetched, 64);
}

/// A leaf that lost a whole block reads it in pieces the transport takes: at most
/// `limits.max_read` bytes each (a transport refuses a longer read, and the operation
/// failed), here 8 chunks (and 3 where the limit is not a whole number of chunks).
#[test]
fn a_lost_block_is_read_in_pieces_of_at_most_max_read() {
    for (max_read, reads) in [(8 * 4096, 8), (3 * 4096 + 100, 22)] {
        let mut net = Net::new(6, |c| c.limits.max_read = max_read);
        net.faults.rules.push(Box::new(|_, _, _, to| to == 3));
        net.broadcast_at(0, 0, 0, 64 * 4096);
        net.run(STEPS);
        net.assert_all_completed();
        let st = net.sessions[3].stats();
        assert_eq!(
            (st.chunks_fetched, st.reads),
            (64, reads),
            "at most {max_read}"
        );
    }
    // An Allgather on three lanes, short last chunks, every leaf losing a fifth.
    let mut net = Net::new(4, |c| {
        c.lanes = 3;
        c.limits.max_read = 2 * 4096;
    });
    net.faults.loss = 0.2;
    net.allgather_at(0, 0, vec![10 * 4096 + 17, 3 * 4096, 0, 7 * 4096 + 1]);
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn every_leaf_misses_the_same_chunk() {
    let mut net = Net::new(8, |_| {});
    net.faults.rules.push(Box::new(|_, _, chunk, _| chunk == 5));
    net.broadcast_at(0, 0, 3, 16 * 4096);
    net.run(STEPS);
    net.assert_all_completed();
    // Ranks that find their predecessor lacking probe further back (skip distances), so
    // the recursion no longer walks the whole ring back to the root: at most log2(8) deep
    // (with 8 ranks every skip distance reaches the root itself).
    let depth = net
        .sessions
        .iter()
        .map(|s| s.stats().max_fetch_depth)
        .max()
        .unwrap();
    assert!(depth <= 3, "depth {depth}");
    let fetched: u64 = net.sessions.iter().map(|s| s.stats().chunks_fetched).sum();
    assert_eq!(fetched, 7, "each of the 7 leaves reads chunk 5 once");
}

#[test]
fn neighbour_chain_misses_overlapping_ranges() {
    let mut net = Net::new(6, |_| {});
    // r1 misses 0..8, r2 misses 4..12, r3 misses 8..16: each one's gap overlaps the next.
    net.faults.rules.push(Box::new(|_, _, c, to| {
        (1..=3).contains(&to) && (c / 4 == to - 1 || c / 4 == to)
    }));
    net.broadcast_at(0, 0, 0, 20 * 4096);
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn last_chunk_short_and_lanes() {
    let mut net = Net::new(4, |c| c.lanes = 3);
    net.faults.loss = 0.2;
    net.broadcast_at(0, 0, 1, 10 * 4096 + 17);
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn concurrent_broadcasts_from_different_roots() {
    let mut net = Net::new(7, |_| {});
    net.faults.loss = 0.05;
    net.faults.jitter_ns = 20_000;
    for (i, root) in [0u32, 3, 6, 3].into_iter().enumerate() {
        net.broadcast_at(i as u64 * 500, 100, root, 30_000 + i as u64 * 7_000);
    }
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn stale_packets_of_an_earlier_operation_are_dropped() {
    let mut net = Net::new(4, |_| {});
    net.faults.replay_after_ns = Some(400_000);
    net.broadcast_at(0, 0, 0, 8 * 4096);
    // The second broadcast runs while replays of the first arrive.
    net.broadcast_at(300_000, 0, 1, 8 * 4096);
    net.run(STEPS);
    net.assert_all_completed();
    let stale: u64 = net
        .sessions
        .iter()
        .map(|s| {
            s.stats().dropped_stale + s.stats().dropped_wrong_source + s.stats().dropped_duplicate
        })
        .sum();
    assert!(stale > 0);
}

fn check_crash(ranks: u32, root: u32, victim: u32, at: u64) {
    let mut net = Net::new(ranks, |_| {});
    net.faults.loss = 0.1;
    net.faults.crash.push((victim, at));
    net.broadcast_at(0, 0, root, 64 * 4096);
    net.run(STEPS);
    assert!(net.errors.is_empty(), "{:?}", net.errors);
    let mut failed = 0;
    for r in (0..ranks).filter(|r| *r != victim) {
        match net.outcome(r, 0) {
            Outcome::Completed(_) => {}
            Outcome::Failed(e) => {
                failed += 1;
                assert_eq!(e.peer(), Rank(victim), "r{r} blames the wrong rank: {e:?}");
            }
            Outcome::Pending => panic!("r{r} hangs"),
        }
    }
    assert!(failed > 0, "a crash must fail somebody");
}

#[test]
fn root_crash_fails_every_rank_naming_the_root() {
    check_crash(6, 0, 0, 100_000);
    check_crash(6, 2, 2, 0);
}

#[test]
fn leaf_crash_before_and_during_the_operation() {
    check_crash(6, 0, 3, 0);
    check_crash(6, 0, 3, 120_000);
    check_crash(6, 0, 5, 120_000);
    check_crash(2, 0, 1, 0);
}

#[test]
fn leaf_crash_blames_the_leaf_directly() {
    let mut net = Net::new(4, |_| {});
    net.faults.crash.push((2, 0));
    net.broadcast_at(0, 0, 0, 4096);
    net.run(STEPS);
    assert_eq!(
        net.outcome(0, 0),
        Outcome::Failed(OpError::PeerUnresponsive { peer: Rank(2) })
    );
    assert!(matches!(
        net.outcome(1, 0),
        Outcome::Failed(OpError::PeerFailed {
            peer: Rank(2),
            reported_by: Rank(0)
        })
    ));
}
