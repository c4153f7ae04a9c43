//! Multi-rank Allgather(v) scenarios on the in-process network.

mod util;

use ringcast_core::Rank;
use util::{Net, Outcome};

const STEPS: usize = 5_000_000;

#[test]
fn loss_free_allgather_needs_no_recovery() {
    let mut net = Net::new(6, |_| {});
    net.allgather_at(0, 0, vec![20_000; 6]);
    net.run(STEPS);
    net.assert_all_completed();
    for s in &net.sessions {
        assert_eq!(s.stats().chunks_fetched, 0);
        assert_eq!(
            s.stats().dropped_own,
            5,
            "own loopback is dropped, never counted"
        );
    }
}

#[test]
fn allgatherv_with_empty_and_uneven_blocks() {
    let mut net = Net::new(7, |c| c.chains = 3);
    net.faults.loss = 0.1;
    net.allgather_at(0, 30, vec![0, 9_000, 1, 0, 40_000, 4096, 0]);
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn uneven_chains_and_lanes_under_loss() {
    for (ranks, chains, lanes) in [(7, 3, 2), (10, 4, 3), (5, 5, 1), (9, 1, 4)] {
        let mut net = Net::new(ranks, |c| {
            c.chains = chains;
            c.lanes = lanes;
        });
        net.faults.loss = 0.15;
        net.faults.jitter_ns = 10_000;
        net.allgather_at(0, 0, vec![12_345; ranks as usize]);
        net.run(STEPS);
        net.assert_all_completed();
    }
}

#[test]
fn a_rank_missing_every_other_block_recovers_in_one_request() {
    let mut net = Net::new(6, |_| {});
    net.faults.rules.push(Box::new(|_, _, _, to| to == 2));
    net.allgather_at(0, 0, vec![16 * 4096; 6]);
    net.run(STEPS);
    net.assert_all_completed();
    let s = net.sessions[2].stats();
    assert_eq!(s.chunks_fetched, 5 * 16);
    assert_eq!(s.fetch_requests, 1, "one request covers every root's runs");
}

#[test]
fn every_rank_misses_a_chunk_of_every_other_root() {
    // The recursion cannot end at one root: each rank must serve its own block while it
    // waits for the others'. Partial acknowledgements keep the ring from deadlocking.
    let mut net = Net::new(5, |_| {});
    net.faults
        .rules
        .push(Box::new(|_, root, chunk, to| root != to && chunk == 1));
    net.allgather_at(0, 0, vec![4 * 4096; 5]);
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn fsdp_pipeline_of_allgathers_and_broadcasts() {
    let mut net = Net::new(6, |c| c.lanes = 2);
    net.faults.loss = 0.05;
    net.faults.dup = 0.05;
    net.faults.jitter_ns = 30_000;
    // Layer i's allgather starts while layer i-1's is still running; a broadcast in between.
    net.allgather_at(0, 100, vec![30_000; 6]);
    net.allgather_at(20_000, 100, vec![25_000; 6]);
    net.broadcast_at(25_000, 50, 4, 50_000);
    net.allgather_at(40_000, 100, vec![8_000, 0, 8_000, 0, 8_000, 0]);
    net.run(STEPS);
    net.assert_all_completed();
}

#[test]
fn crash_during_allgather_blames_the_crashed_rank() {
    for (victim, at) in [(3u32, 0u64), (3, 30_000), (0, 20_000)] {
        let mut net = Net::new(6, |_| {});
        net.faults.loss = 0.05;
        net.faults.crash.push((victim, at));
        net.allgather_at(0, 0, vec![64 * 1024; 6]);
        net.run(STEPS);
        assert!(net.errors.is_empty(), "{:?}", net.errors);
        // A survivor may still complete (with the exact bytes: `errors` is empty) when it got
        // everything before the crash mattered to it; otherwise it must blame the victim.
        let mut failed = 0;
        for r in (0..6).filter(|r| *r != victim) {
            match net.outcome(r, 0) {
                Outcome::Completed(_) => {}
                Outcome::Failed(e) => {
                    failed += 1;
                    assert_eq!(e.peer(), Rank(victim), "r{r}: {e:?}");
                }
                Outcome::Pending => panic!("r{r} hangs with rank {victim} crashed at {at}"),
            }
        }
        assert!(failed > 0);
    }
}

/// A rank whose control connections go dead (an nft drop) right after its data is complete
/// withholds its `Fin`: its predecessor still waits in that operation when the hub (rank 0),
/// done with it, starts the next one. The hub must blame the silent rank, not the
/// predecessor that only waits on it.
#[test]
fn a_rank_cut_off_before_its_fin_is_blamed_by_the_next_barrier() {
    let sizes = vec![16 * 1024; 4];
    // Where the loss-free operation's messages fall.
    let mut clean = Net::new(4, |_| {});
    clean.trace = Some(String::new());
    clean.allgather_at(0, 0, sizes.clone());
    clean.run(STEPS);
    clean.assert_all_completed();
    let trace = clean.trace.take().unwrap_or_default();
    let time_of = |needle: &str| -> u64 {
        let line = trace
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in the trace:\n{trace}"));
        line.split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .expect("a time")
    };
    let fin = time_of("r2 -> r1 Fin");
    let done = last_completion(&clean, 0);

    let mut net = Net::new(4, |_| {});
    net.faults.control_cut.push((2, fin));
    net.allgather_at(0, 0, sizes.clone());
    // Ranks 0 and 3 complete the first operation and post the next; ranks 1 and 2 are still
    // in the first (1 waits for 2's `Fin`, 2 for 3's).
    for r in [0, 3] {
        net.start_rank(
            done + 1_000,
            r,
            util::Start::Allgather {
                sizes: sizes.clone(),
            },
        );
    }
    net.run(STEPS);
    assert!(net.errors.is_empty(), "{:?}", net.errors);
    for r in [0, 3] {
        assert!(matches!(net.outcome(r, 0), Outcome::Completed(_)), "r{r}");
    }
    for (r, op) in [(0, 1), (1, 0), (3, 1)] {
        match net.outcome(r, op) {
            Outcome::Failed(e) => assert_eq!(e.peer(), Rank(2), "r{r} op {op}: {e:?}"),
            o => panic!("r{r} op {op}: {o:?}"),
        }
    }
}

/// A root vouches for its own block from the start: a rank that lost a chunk of it reads it
/// while the root's lane still receives the later roots' blocks (one chain: they come one
/// after another), and the Allgather ends when a loss-free one does. The root answered "not
/// known" until its lane was full, and every rank finished 3.3 us late (virtual time).
#[test]
fn a_root_answers_for_its_own_block_while_its_lane_is_open() {
    let end = |lossy: bool| {
        let mut net = Net::new(4, |c| c.chains = 1);
        net.byte_ns = 0.08;
        if lossy {
            // Rank 1 loses chunk 3 of rank 0's block.
            net.faults.rules.push(Box::new(|_, from, chunk, to| {
                from == 0 && to == 1 && chunk == 3
            }));
        }
        net.allgather_at(0, 0, vec![200 * 4096; 4]);
        net.run(STEPS);
        net.assert_all_completed();
        assert_eq!(net.sessions[1].stats().chunks_fetched, u64::from(lossy));
        (0..4)
            .map(|r| match net.outcome(r, 0) {
                Outcome::Completed(t) => t,
                o => panic!("r{r}: {o:?}"),
            })
            .max()
            .unwrap()
    };
    let (clean, lossy) = (end(false), end(true));
    assert!(
        lossy <= clean + 1_000,
        "{lossy} ns against {clean} ns loss-free"
    );
}

/// A rank whose NIC stops sending (a PFC pause of its data class; control still flows)
/// at any point of its block fails naming itself (`SendsStalled`), and every rank that does
/// not complete names it; nobody hangs. (`driver.rs` has the root whose wait for `Fin` ran
/// out first and named its successor.)
#[test]
fn a_rank_whose_sends_stop_is_named_by_all_itself_included() {
    let sizes = vec![64 * 1024; 4];
    let mut clean = Net::new(4, |c| c.chains = 2);
    clean.byte_ns = 0.8;
    clean.allgather_at(0, 0, sizes.clone());
    clean.run(STEPS);
    clean.assert_all_completed();
    let done = last_completion(&clean, 0);
    // Pauses from the start to past the end of rank 2's posts (it posts its block in
    // windows; what it posted before the pause leaves).
    let mut stalled = 0;
    for k in 0..16 {
        let at = done * k / 256;
        let mut net = Net::new(4, |c| c.chains = 2);
        net.byte_ns = 0.8;
        net.faults.paused.push((2, at));
        net.allgather_at(0, 0, sizes.clone());
        net.run(STEPS);
        assert!(net.errors.is_empty(), "paused at {at}: {:?}", net.errors);
        match net.outcome(2, 0) {
            Outcome::Failed(e) => {
                assert_eq!(
                    e,
                    ringcast_core::OpError::SendsStalled { rank: Rank(2) },
                    "paused at {at} of {done}"
                );
                stalled += 1;
            }
            // Its block was out before the pause.
            Outcome::Completed(_) => {}
            Outcome::Pending => panic!("r2 hangs, paused at {at}"),
        }
        for r in [0, 1, 3] {
            match net.outcome(r, 0) {
                Outcome::Completed(_) => {}
                Outcome::Failed(e) => assert_eq!(e.peer(), Rank(2), "r{r} paused at {at}: {e:?}"),
                Outcome::Pending => panic!("r{r} hangs, paused at {at}"),
            }
        }
    }
    assert!(stalled >= 2, "only {stalled} pauses caught the block");
}

/// When the last rank completed operation `op` (every rank must have).
fn last_completion(net: &Net, op: u64) -> u64 {
    (0..net.ranks())
        .map(|r| match net.outcome(r, op) {
            Outcome::Completed(t) => t,
            o => panic!("r{r}: {o:?}"),
        })
        .max()
        .expect("ranks")
}
