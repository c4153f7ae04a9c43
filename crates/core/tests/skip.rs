//! Ids taken with `skip_op` (operations that run over another path) are never started here:
//! the next collective gets the id after them, and a message for a skipped id is stale, so a
//! rank that ran the operation instead can never be mistaken for the next one.

use ringcast_core::wire::ControlRepr;
use ringcast_core::{Config, Instant, Node, OpId, Rank, broadcast_shape};

/// Rank 1's `Ready` for a Broadcast of 64 KiB from rank 0 (the one this test starts).
fn ready(op: u64) -> Vec<u8> {
    let mut v = Vec::new();
    let shape = broadcast_shape(Rank(0), 1 << 16);
    ControlRepr::Ready { op, shape }.emit_vec(&mut v).unwrap();
    v
}

#[test]
fn skipped_ids_are_never_started_and_their_messages_are_stale() {
    let mut n = Node::new(Config::new(0, 2)).unwrap();
    let now = Instant::from_nanos(10);
    // Rank 1 ran operation 0 over multicast where this rank skipped it: its `Ready` came
    // first and was kept for an operation not started yet.
    n.handle_control(now, Rank(1), &ready(0));
    assert_eq!(n.skip_op(), OpId(0));
    let b = n.start_broadcast(now, Rank(0), 1 << 16).unwrap();
    assert_eq!(b, OpId(1));
    assert_eq!(n.inflight(), 1);
    // The kept `Ready` went with the skip: operation 1 (this rank is its hub) still waits
    // for rank 1's own `Ready`.
    let mut buf = Vec::new();
    let mut sent = 0;
    while n.poll_transmit(&mut buf).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 0, "no Go before rank 1 is ready for operation 1");
    let stale = n.stats().control_stale;
    n.handle_control(now, Rank(1), &ready(0));
    assert_eq!(
        n.stats().control_stale,
        stale + 1,
        "a Ready for a skipped id is stale"
    );
    n.handle_control(now, Rank(1), &ready(1));
    let mut go = 0;
    while n.poll_transmit(&mut buf).is_some() {
        go += 1;
    }
    assert!(go > 0, "operation 1 goes on once rank 1 is ready for it");
}
