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
    n.handle_peer_lost(now, Rank(3), b);
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
    n.handle_peer_lost(now, Rank(1), OpId(0));
    n.handle_peer_lost(now, Rank(9), OpId(0));
    assert_eq!(n.inflight(), 1);
    n.handle_peer_lost(now, Rank(0), OpId(0));
    assert!(matches!(
        n.poll_event(),
        Some(Event::Failed { op, error: OpError::PeerLost { peer: Rank(0) } }) if op == a
    ));
    assert_eq!(n.inflight(), 0);
}
