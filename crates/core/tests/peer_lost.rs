//! A rank the transport lost (its control connection closed) fails every operation it could
//! still be needed for, at once, naming it, and tells the others through `Abort`.

use ringcast_core::wire::ControlRepr;
use ringcast_core::{Config, Event, Instant, Node, OpError, OpId, Rank, Transmit};

#[test]
fn a_lost_peer_fails_its_operations_at_once_and_the_others_hear_of_it() {
    let mut n = Node::new(Config::new(1, 4)).unwrap();
    let now = Instant::from_nanos(10);
    let a = n.start_broadcast(now, Rank(0), 1 << 16).unwrap();
    let b = n.start_broadcast(now, Rank(2), 1 << 16).unwrap();
    let mut buf = Vec::new();
    while n.poll_transmit(&mut buf).is_some() {}
    // Rank 3 left cleanly after finishing `a`: only `b` still needs it.
    n.handle_peer_lost(now, Rank(3), b, None);
    let mut aborts = Vec::new();
    while let Some(t) = n.poll_transmit(&mut buf) {
        if let Transmit::Control { to, len } = t {
            match ControlRepr::parse_bytes(&buf[..len]).unwrap() {
                ControlRepr::Abort { op, culprit } => aborts.push((to, op, culprit)),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(aborts, vec![(Rank(0), b.0, 3), (Rank(2), b.0, 3)]);
    assert_eq!(
        n.poll_event(),
        Some(Event::Failed {
            op: b,
            error: OpError::PeerLost { peer: Rank(3) }
        })
    );
    assert_eq!(n.poll_event(), None);
    assert_eq!(n.inflight(), 1, "{a} goes on");
    // Lost from the first operation on: everything fails; ourselves or a stranger: nothing.
    n.handle_peer_lost(now, Rank(1), OpId(0), None);
    n.handle_peer_lost(now, Rank(9), OpId(0), None);
    assert_eq!(n.inflight(), 1);
    n.handle_peer_lost(now, Rank(0), OpId(0), None);
    assert!(matches!(
        n.poll_event(),
        Some(Event::Failed { op, error: OpError::PeerLost { peer: Rank(0) } }) if op == a
    ));
    assert_eq!(n.inflight(), 0);
}

/// Every `Abort` this node sent: (to, op, culprit).
fn aborts(n: &mut Node) -> Vec<(Rank, u64, u32)> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while let Some(t) = n.poll_transmit(&mut buf) {
        if let Transmit::Control { to, len } = t
            && let ControlRepr::Abort { op, culprit } =
                ControlRepr::parse_bytes(&buf[..len]).unwrap()
        {
            out.push((to, op, culprit));
        }
    }
    out
}

#[test]
fn a_peer_that_left_over_a_failure_passes_the_blame_on() {
    let mut n = Node::new(Config::new(1, 4)).unwrap();
    let now = Instant::from_nanos(10);
    let a = n.start_broadcast(now, Rank(0), 1 << 16).unwrap();
    let b = n.start_allgather(now, &[1 << 12; 4]).unwrap();
    aborts(&mut n);
    // Rank 3 left after finishing `a`, over rank 2's failure (which this rank has not heard
    // of): `b` fails naming rank 2 as reported by rank 3; the others hear of rank 2, not rank
    // 2 itself (hung; rank 3, gone, misses nothing).
    n.handle_peer_lost(now, Rank(3), b, Some(Rank(2)));
    assert_eq!(aborts(&mut n), vec![(Rank(0), b.0, 2), (Rank(3), b.0, 2)]);
    assert_eq!(
        n.poll_event(),
        Some(Event::Failed {
            op: b,
            error: OpError::PeerFailed {
                peer: Rank(2),
                reported_by: Rank(3)
            }
        })
    );
    assert_eq!(n.inflight(), 1, "{a} goes on");
    // A goodbye blaming this rank, or no rank, names the rank that left.
    let mut n = Node::new(Config::new(1, 4)).unwrap();
    for blamed in [Rank(1), Rank(7)] {
        let c = n.start_broadcast(now, Rank(0), 1 << 16).unwrap();
        aborts(&mut n);
        n.handle_peer_lost(now, Rank(3), c, Some(blamed));
        assert_eq!(
            n.poll_event(),
            Some(Event::Failed {
                op: c,
                error: OpError::PeerLost { peer: Rank(3) }
            })
        );
    }
}

fn abort(op: u64, culprit: u32) -> Vec<u8> {
    let mut v = Vec::new();
    ControlRepr::Abort { op, culprit }.emit_vec(&mut v).unwrap();
    v
}

fn failures(n: &mut Node) -> Vec<(OpId, OpError)> {
    let mut out = Vec::new();
    while let Some(e) = n.poll_event() {
        if let Event::Failed { op, error } = e {
            out.push((op, error));
        }
    }
    out
}

#[test]
fn a_barrier_waiting_on_a_rank_reported_failed_fails_at_once() {
    let now = Instant::from_nanos(10);
    let failed = |peer, by| OpError::PeerFailed {
        peer: Rank(peer),
        reported_by: Rank(by),
    };
    // Rank 1 waits for `Go` from the roots, rank 0 and rank 2. Rank 3 reports that rank 2
    // failed operation `a`: `a` fails as reported, `b` (whose hub is rank 2) at once, not
    // after its long timer; `c` (hub rank 0) goes on.
    let mut n = Node::new(Config::new(1, 4)).unwrap();
    let a = n.start_broadcast(now, Rank(0), 1 << 16).unwrap();
    let b = n.start_broadcast(now, Rank(2), 1 << 16).unwrap();
    let c = n.start_broadcast(now, Rank(0), 1 << 16).unwrap();
    aborts(&mut n);
    n.handle_control(now, Rank(3), &abort(a.0, 2));
    assert_eq!(failures(&mut n), vec![(a, failed(2, 3)), (b, failed(2, 3))]);
    let told = vec![(Rank(0), b.0, 2), (Rank(3), b.0, 2)];
    assert_eq!(aborts(&mut n), told, "{b}'s end is told, the reporter too");
    assert_eq!(n.inflight(), 1, "{c} goes on");
    // A report naming this rank, or no rank, fails nothing else.
    n.handle_control(now, Rank(3), &abort(a.0, 1));
    n.handle_control(now, Rank(3), &abort(a.0, 9));
    assert_eq!(n.inflight(), 1);

    // The hub (rank 0) of an Allgather that rank 3 joined, not rank 2: a goodbye of rank 1
    // over rank 2's failure, after it finished the operation, fails it at once.
    let mut n = Node::new(Config::new(0, 4)).unwrap();
    let d = n.start_allgather(now, &[1 << 12; 4]).unwrap();
    let e = n.start_allgather(now, &[1 << 12; 4]).unwrap();
    let mut v = Vec::new();
    let shape = ringcast_core::allgather_shape(&[1 << 12; 4]);
    ControlRepr::Ready { op: d.0, shape }
        .emit_vec(&mut v)
        .unwrap();
    n.handle_control(now, Rank(3), &v);
    n.handle_peer_lost(now, Rank(1), e, Some(Rank(2)));
    assert_eq!(failures(&mut n), vec![(e, failed(2, 1)), (d, failed(2, 1))]);
    assert_eq!(n.inflight(), 0);
}

/// A rank waiting in its barrier for a hub that is gone, while messages keep coming "from"
/// the hub that the operation does not take (a stray `FetchNack`, from a confused or hostile
/// peer): each pushed the wait out, without end (a post timeout of 5 ms failed at 60 ms).
/// The wait ends by the post timeout twice over, and names the hub it waited for, not its
/// successor (which owes it nothing in the barrier).
#[test]
fn a_barrier_wait_on_a_silent_hub_ends_whatever_else_comes_from_it() {
    use core::time::Duration;
    let mut cfg = Config::new(1, 3);
    cfg.peer_timeout = Duration::from_millis(1);
    cfg.post_timeout = Duration::from_millis(5);
    let mut n = Node::new(cfg).unwrap();
    let op = n
        .start_broadcast(Instant::from_nanos(0), Rank(0), 1 << 16)
        .unwrap();
    let mut stray = Vec::new();
    ControlRepr::FetchNack { op: op.0 }
        .emit_vec(&mut stray)
        .unwrap();
    let step = 300_000;
    let mut failed = None;
    for k in 1..1000u64 {
        let now = Instant::from_nanos(k * step);
        n.handle_control(now, Rank(0), &stray);
        if n.poll_timeout().is_some_and(|t| t <= now) {
            n.handle_timeout(now);
        }
        let mut buf = Vec::new();
        while n.poll_transmit(&mut buf).is_some() {}
        if let Some(Event::Failed { error, .. }) = n.poll_event() {
            failed = Some((k * step, error));
            break;
        }
    }
    let (at, error) = failed.expect("the wait never ended");
    assert!(at <= 11_000_000, "failed at {at} ns");
    assert_eq!(error, OpError::PeerUnresponsive { peer: Rank(0) });
}
