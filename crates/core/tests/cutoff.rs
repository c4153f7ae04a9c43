//! `Config::cutoff_extension`: a cutoff that fires while chunks are still arriving (the
//! transport is slower than `link_bandwidth` says) pushes itself out instead of sending the
//! rest of the buffer through the slow path; a stalled fast path still ends.

mod util;

use std::time::Duration;
use util::Net;

/// 4 ranks, a 64 KiB Broadcast whose chunks take 1 ns per byte to send, while the cutoff
/// believes links are 100x faster.
fn net(extension: Option<Duration>) -> Net {
    let mut net = slow(extension);
    net.broadcast_at(0, 0, 0, 64 << 10);
    net
}

/// 4 ranks whose chunks take 1 ns per byte to send, with links the cutoff believes 100x
/// faster.
fn slow(extension: Option<Duration>) -> Net {
    Net::new(4, |c| {
        c.link_bandwidth = 100_000_000_000;
        c.cutoff_extension = extension;
    })
}

fn fetched(net: &Net) -> u64 {
    net.sessions.iter().map(|s| s.stats().chunks_fetched).sum()
}

#[test]
fn a_cutoff_that_fires_while_chunks_arrive_is_pushed_out() {
    let mut early = net(None);
    early.run(100_000);
    early.assert_all_completed();
    assert!(
        fetched(&early) > 0,
        "the early cutoff sends chunks through the slow path"
    );

    let mut patient = net(Some(Duration::from_micros(10)));
    patient.run(100_000);
    patient.assert_all_completed();
    assert_eq!(fetched(&patient), 0, "every chunk came by multicast");
}

#[test]
fn a_stalled_fast_path_still_ends_with_the_extension() {
    // One chunk never arrives at rank 2: the extension must not wait for it forever.
    let mut n = net(Some(Duration::from_micros(10)));
    n.faults
        .rules
        .push(Box::new(|_, _, chunk, to| chunk == 5 && to == 2));
    n.run(100_000);
    n.assert_all_completed();
    assert_eq!(n.sessions[2].stats().chunks_fetched, 1);
}

/// 4 ranks, an Allgather of 64 KiB per rank, as slow against `link_bandwidth` as above: the
/// per-block deadlines fire while the blocks still arrive.
fn allgather(extension: Option<Duration>) -> Net {
    let mut net = slow(extension);
    net.allgather_at(0, 0, vec![64 << 10; 4]);
    net
}

#[test]
fn overdue_blocks_that_still_arrive_are_kept_with_the_extension() {
    let mut early = allgather(None);
    early.run(400_000);
    early.assert_all_completed();
    assert!(
        fetched(&early) > 0,
        "the early block deadlines send chunks through the slow path"
    );

    let mut patient = allgather(Some(Duration::from_micros(10)));
    patient.run(400_000);
    patient.assert_all_completed();
    assert_eq!(fetched(&patient), 0, "every chunk came by multicast");
}

#[test]
fn an_overdue_block_that_stalls_is_still_recovered_with_the_extension() {
    // The last chunk of rank 1's block never reaches rank 3.
    let mut n = allgather(Some(Duration::from_micros(10)));
    n.faults.rules.push(Box::new(|_, root, chunk, to| {
        root == 1 && chunk == 15 && to == 3
    }));
    n.run(400_000);
    n.assert_all_completed();
    assert_eq!(n.sessions[3].stats().chunks_fetched, 1);
}
