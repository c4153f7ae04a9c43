//! Ids taken with `skip_op` (operations that run over another path) are never started here:
//! the next collective gets the id after them, and a message for a skipped id is stale, so a
//! rank that ran the operation instead can never be mistaken for the next one. A `Ready` for
//! a skipped id says the ranks disagree on where the operation runs: the others are told once
//! (`Mismatch`), so that the ranks that started it fail it at once.

use ringcast_core::wire::ControlRepr;
use ringcast_core::{Config, Instant, Node, OpId, Rank, Transmit, broadcast_shape};

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
    // The kept `Ready` went with the skip, and rank 1 hears that it started an operation
    // this rank skipped; operation 1 (this rank is its hub) still waits for rank 1's own
    // `Ready`.
    let mut buf = Vec::new();
    let mut sent = Vec::new();
    let mut drain = |n: &mut Node| {
        while let Some(t) = n.poll_transmit(&mut buf) {
            if let Transmit::Control { to, len } = t {
                sent.push((
                    to,
                    format!("{:?}", ControlRepr::parse_bytes(&buf[..len]).unwrap()),
                ));
            }
        }
        std::mem::take(&mut sent)
    };
    assert_eq!(
        drain(&mut n),
        [(Rank(1), "Mismatch { op: 0, culprit: 1 }".to_owned())],
        "no Go before rank 1 is ready for operation 1"
    );
    let stale = n.stats().control_stale;
    n.handle_control(now, Rank(1), &ready(0));
    assert_eq!(
        n.stats().control_stale,
        stale + 1,
        "a Ready for a skipped id is stale"
    );
    assert_eq!(drain(&mut n), [], "the ranks are told once");
    n.handle_control(now, Rank(1), &ready(1));
    let sent = drain(&mut n);
    assert_eq!(
        sent.first(),
        Some(&(Rank(1), "Go { op: 1 }".to_owned())),
        "operation 1 goes on once rank 1 is ready for it: {sent:?}"
    );
}

/// A peer that ran many operations elsewhere (and skipped their ids) is that many ids ahead of
/// a rank that has not posted them yet: its `Ready` for the next collective is kept however
/// far ahead it is, and the collective goes on as soon as this rank starts it. What one peer
/// can leave here is bounded by the operations it may have in flight, not by distance (and its
/// failures apart, alike).
#[test]
fn a_ready_far_ahead_is_kept_and_one_peer_keeps_at_most_a_window() {
    const AHEAD: u64 = 5_000;
    let cfg = Config::new(0, 2);
    let window = u64::from(cfg.limits.max_inflight_ops);
    let mut n = Node::new(cfg).unwrap();
    let now = Instant::from_nanos(10);
    n.handle_control(now, Rank(1), &ready(AHEAD));
    // This rank catches up: the operations before ran over TCP here too.
    for k in 0..AHEAD {
        assert_eq!(n.skip_op(), OpId(k));
    }
    assert_eq!(
        n.start_broadcast(now, Rank(0), 1 << 16).unwrap(),
        OpId(AHEAD)
    );
    let mut buf = Vec::new();
    let mut sent = Vec::new();
    while let Some(t) = n.poll_transmit(&mut buf) {
        if let Transmit::Control { to, len } = t {
            sent.push((to, ControlRepr::parse_bytes(&buf[..len]).unwrap().op()));
        }
    }
    assert!(
        sent.contains(&(Rank(1), AHEAD)),
        "the kept Ready let the broadcast go: {sent:?}"
    );
    // One peer's `Ready`s for operations not started here: `window` kept, the next dropped.
    let base = AHEAD + 1_000;
    let unexpected = n.stats().control_unexpected;
    for k in 0..window {
        n.handle_control(now, Rank(1), &ready(base + 3 * k));
    }
    assert_eq!(n.stats().control_unexpected, unexpected);
    n.handle_control(now, Rank(1), &ready(base + 3 * window));
    assert_eq!(n.stats().control_unexpected, unexpected + 1);
    // Its failures are kept apart: a full window of `Ready`s does not crowd them out, nor
    // they the `Ready`s; they are bounded alike.
    let abort = |op: u64| {
        let mut v = Vec::new();
        ControlRepr::Abort { op, culprit: 1 }
            .emit_vec(&mut v)
            .unwrap();
        v
    };
    let far = base + 10 * window;
    for k in 0..window {
        n.handle_control(now, Rank(1), &abort(far + k));
    }
    assert_eq!(n.stats().control_unexpected, unexpected + 1);
    n.handle_control(now, Rank(1), &abort(far + window));
    assert_eq!(n.stats().control_unexpected, unexpected + 2);
}

/// Ids skipped while a collective is in flight can bring the next id's immediate tag around
/// to that collective's: the next one then waits (`can_start`, `TagInUse`) until the first
/// has ended, so that a lane never holds two operations under one tag.
#[test]
fn the_next_collective_waits_while_its_tag_is_in_flight() {
    let mut cfg = Config::new(0, 2);
    cfg.imm = ringcast_core::wire::ImmLayout::new(22).unwrap();
    let tags = cfg.imm.op_tags();
    let mut n = Node::new(cfg).unwrap();
    let now = Instant::from_nanos(10);
    assert_eq!(n.start_broadcast(now, Rank(0), 1 << 16).unwrap(), OpId(0));
    for k in 1..tags {
        assert_eq!(n.skip_op(), OpId(k));
        assert!(n.can_start() || k == tags - 1);
    }
    // The next id, `tags`, has operation 0's tag.
    assert!(!n.can_start());
    assert_eq!(
        n.start_broadcast(now, Rank(0), 1 << 16),
        Err(ringcast_core::StartError::TagInUse { op: OpId(0) })
    );
    assert_eq!(n.inflight(), 1);
    // Operation 0 ends (rank 1 aborts it): the tag is free, and the id was not used up.
    let mut abort = Vec::new();
    ControlRepr::Abort { op: 0, culprit: 1 }
        .emit_vec(&mut abort)
        .unwrap();
    n.handle_control(now, Rank(1), &abort);
    assert_eq!(n.inflight(), 0);
    assert!(n.can_start());
    assert_eq!(
        n.start_broadcast(now, Rank(0), 1 << 16).unwrap(),
        OpId(tags)
    );
}
