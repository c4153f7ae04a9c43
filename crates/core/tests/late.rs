//! Ranks that post an operation late: alive, only slow (an application that loads a
//! checkpoint on one rank before a Broadcast). The barrier asks the ranks it waits on where
//! they stand (`Where` / `Here`) instead of blaming them at the peer timeout, waits for the
//! late ones up to the post timeout, and still names a rank that does not answer (hung or
//! cut off) within a few peer timeouts.

mod util;

use ringcast_core::wire::{ControlRepr, Standing};
use ringcast_core::{Config, Event, Instant, Node, OpError, Rank, Transmit};
use std::time::Duration;
use util::{Net, Outcome, Start};

const LEN: u64 = 64 << 10;
/// The network's peer timeout (1 ms) in its nanoseconds.
const PT: u64 = 1_000_000;
/// The post timeout these tests set: 40 peer timeouts.
const POST: u64 = 40 * PT;

fn net(ranks: u32) -> Net {
    net_with(ranks, POST)
}

fn net_with(ranks: u32, post: u64) -> Net {
    let mut net = Net::new(ranks, |c| c.post_timeout = Duration::from_nanos(post));
    net.trace = Some(String::new());
    net
}

fn trace(net: &Net) -> &str {
    net.trace.as_deref().unwrap_or_default()
}

/// The bytes of control message `m`.
fn bytes(m: ControlRepr<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    m.emit_vec(&mut v).expect("canonical");
    v
}

/// The control messages `n` sends now, each to whom and as `Debug` text.
fn sent(n: &mut Node) -> Vec<(Rank, String)> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while let Some(t) = n.poll_transmit(&mut buf) {
        if let Transmit::Control { to, len } = t {
            let m = ControlRepr::parse_bytes(&buf[..len]).expect("canonical");
            out.push((to, format!("{m:?}")));
        }
    }
    out
}

/// What `n` answers rank 0, which asks where it stands on `op`, as `sent` shows it.
fn asked(n: &mut Node, op: u64) -> Vec<(Rank, String)> {
    let q = bytes(ControlRepr::Where { op });
    n.handle_control(Instant::from_nanos(1), Rank(0), &q);
    sent(n)
}

/// `Here` about `op` with `standing`, as `sent` shows it.
fn here(op: u64, standing: Standing) -> String {
    format!("{:?}", ControlRepr::Here { op, standing })
}

/// Every rank starts `what` at time 0, except `late`, which starts it `delay` ns later;
/// then an operation every rank agrees on, after that.
fn run_late(ranks: u32, what: Start, late: u32, delay: u64) -> Net {
    let mut net = net(ranks);
    for r in 0..ranks {
        let at = if r == late { delay } else { 0 };
        net.start_rank(at, r, what.clone());
    }
    net.broadcast_at(delay + 5 * PT, 0, ranks - 1, LEN);
    net.run(2_000_000);
    net
}

#[test]
fn a_root_that_posts_many_peer_timeouts_late_is_waited_for() {
    // Rank 0 is the root and the barrier's hub; rank 2 a leaf. Each 10 and 30 peer timeouts
    // late: far past every barrier timer, within the post timeout.
    for (late, delay) in [(0, 10 * PT), (0, 30 * PT), (2, 10 * PT), (2, 30 * PT)] {
        let net = run_late(4, Start::Broadcast { root: 0, len: LEN }, late, delay);
        let t = trace(&net);
        assert!(net.errors.is_empty(), "{:?}\n{t}", net.errors);
        for r in 0..4 {
            for op in 0..2 {
                let o = net.outcome(r, op);
                assert!(
                    matches!(o, Outcome::Completed(_)),
                    "late r{late} by {delay} ns: r{r} op {op}: {o:?}\n{t}"
                );
            }
        }
        // The others asked, and the late rank answered while it had not posted.
        assert!(t.contains("Where { op: 0 }"), "{t}");
        assert!(t.contains("standing: NotPosted }"), "{t}");
    }
}

#[test]
fn a_late_rank_in_an_allgather_is_waited_for() {
    let what = Start::Allgather {
        sizes: vec![LEN, 0, LEN / 2, LEN + 5, 3 * LEN],
    };
    for late in [0, 3] {
        let net = run_late(5, what.clone(), late, 25 * PT);
        net.assert_all_completed();
    }
}

#[test]
fn an_alive_rank_that_never_posts_fails_the_operation_at_the_post_timeout() {
    // A post timeout of two peer timeouts is when the leaves' first wait for `Go` runs out:
    // they have asked nothing yet, and must not name the hub, which runs the operation.
    for (missing, post) in [(0, POST), (2, POST), (2, 2 * PT), (0, 2 * PT)] {
        let mut net = net_with(4, post);
        for r in (0..4).filter(|&r| r != missing) {
            net.start_rank(0, r, Start::Broadcast { root: 0, len: LEN });
        }
        net.run(2_000_000);
        let t = trace(&net);
        assert!(net.errors.is_empty(), "{:?}\n{t}", net.errors);
        for r in (0..4).filter(|&r| r != missing) {
            match net.outcome(r, 0) {
                Outcome::Failed(OpError::NotPosted { peer }) => {
                    assert_eq!(peer, Rank(missing), "r{r}\n{t}")
                }
                Outcome::Failed(OpError::PeerFailed { peer, .. }) => {
                    assert_eq!(peer, Rank(missing), "r{r}\n{t}")
                }
                other => panic!("r{r}: {other:?}\n{t}"),
            }
            // Not before the post timeout, and soon after it.
            let at = net.failed_at[r as usize][&0];
            assert!((post..post + 4 * PT).contains(&at), "r{r} at {at}\n{t}");
        }
        assert_eq!(net.outcome(missing, 0), Outcome::Pending);
    }
}

#[test]
fn a_hung_rank_is_named_within_a_few_peer_timeouts_not_the_post_timeout() {
    // Rank 2's control is cut from the start (an nft drop): it answers nothing.
    for root in [0, 2, 3] {
        let mut net = net(4);
        net.faults.control_cut.push((2, 0));
        net.broadcast_at(0, 0, root, LEN);
        net.run(2_000_000);
        let t = trace(&net);
        for r in (0..4).filter(|&r| r != 2) {
            let o = net.outcome(r, 0);
            let Outcome::Failed(e) = o else {
                panic!("root {root}: r{r}: {o:?}\n{t}")
            };
            assert_eq!(e.peer(), Rank(2), "root {root}: r{r}: {e:?}\n{t}");
            let at = net.failed_at[r as usize][&0];
            assert!(at < 5 * PT, "root {root}: r{r} at {at}\n{t}");
        }
    }
}

#[test]
fn a_rank_that_ran_the_operation_elsewhere_is_caught_by_its_answer() {
    // Rank 2 (a leaf: no `Ready` reaches it) takes operation 0 as one that runs over
    // another path (`skip_op`; ringcast sends short ones over TCP), the others run it here.
    // Nothing tells it of their barrier; before the barrier's questions, the hub waited out
    // the peer timeout and blamed it as hung. Now its answer says it ended the operation
    // without a barrier: the ranks disagree on it.
    let mut net = net(4);
    net.start_rank(0, 2, Start::Skip);
    for r in [0, 1, 3] {
        net.start_rank(1_000, r, Start::Broadcast { root: 0, len: LEN });
    }
    net.broadcast_at(10 * PT, 0, 1, LEN);
    net.run(2_000_000);
    let t = trace(&net);
    assert!(net.errors.is_empty(), "{:?}\n{t}", net.errors);
    assert!(t.contains("standing: EndedApart"), "{t}");
    for r in [0, 1, 3] {
        match net.outcome(r, 0) {
            Outcome::Failed(OpError::ShapeMismatch { peer, .. }) => {
                assert_eq!(peer, Rank(2), "r{r}\n{t}")
            }
            other => panic!("r{r}: {other:?}\n{t}"),
        }
        let at = net.failed_at[r as usize][&0];
        assert!(at < 5 * PT, "r{r} at {at}\n{t}");
    }
    for r in 0..4 {
        assert!(
            matches!(net.outcome(r, 1), Outcome::Completed(_)),
            "r{r}\n{t}"
        );
    }
}

#[test]
fn a_rank_whose_program_stopped_over_a_failure_names_that_failure() {
    // Op 0: rank 3 crashes during it; everyone else fails it naming rank 3. Rank 1's program
    // stops there; ranks 0 and 2 post op 1, whose barrier waits on rank 1 (alive, never
    // posting): its answer names rank 3, so they fail op 1 over rank 3 at once, not at the
    // post timeout nor by blaming rank 1.
    let mut net = net(4);
    net.faults.crash.push((3, 0));
    net.broadcast_at(0, 0, 0, LEN);
    net.run(2_000_000);
    for r in 0..3 {
        let o = net.outcome(r, 0);
        assert!(
            matches!(o, Outcome::Failed(e) if e.peer() == Rank(3)),
            "r{r}: {o:?}\n{}",
            trace(&net)
        );
    }
    let then = net.now;
    for r in [0, 2] {
        net.start_rank(then + 1_000, r, Start::Broadcast { root: 0, len: LEN });
    }
    net.run(2_000_000);
    let t = trace(&net);
    for r in [0, 2] {
        match net.outcome(r, 1) {
            Outcome::Failed(e) => assert_eq!(e.peer(), Rank(3), "r{r}: {e:?}\n{t}"),
            other => panic!("r{r}: {other:?}\n{t}"),
        }
        let at = net.failed_at[r as usize][&1] - then;
        assert!(at < 5 * PT, "r{r} after {at}\n{t}");
    }
}

#[test]
fn a_question_from_this_rank_itself_is_not_answered() {
    // The transport never delivers a rank's own messages to it; one that claims to be from
    // this rank is noise (found by the `session` fuzz target: the answer went to itself).
    let mut n = Node::new(Config::new(1, 3)).unwrap();
    let q = bytes(ControlRepr::Where { op: 0 });
    let now = Instant::from_nanos(1);
    n.handle_control(now, Rank(1), &q);
    assert_eq!(sent(&mut n), []);
    assert_eq!(n.stats().control_unexpected, 1);
    // From another rank, it is answered: not posted yet.
    n.handle_control(now, Rank(2), &q);
    assert_eq!(sent(&mut n), [(Rank(2), here(0, Standing::NotPosted))]);
}

#[test]
fn an_abandoned_operation_is_answered_as_failed_and_a_skipped_one_as_apart() {
    // `abandon_op`: failed here before it started (a peer it needs is gone); `skip_op`: ran
    // over another path. Asked where it stands, the rank says so: only the second is a
    // disagreement on the operation.
    let mut n = Node::new(Config::new(1, 3)).unwrap();
    assert_eq!(n.abandon_op(Rank(2)).0, 0);
    assert_eq!(n.skip_op().0, 1);
    // Nothing is sent for them.
    assert_eq!(sent(&mut n), []);
    for (op, want) in [
        (0, Standing::EndedAfter(2)),
        (1, Standing::EndedApart),
        (2, Standing::NotPosted),
    ] {
        assert_eq!(asked(&mut n, op), [(Rank(0), here(op, want))]);
    }
}

/// A burst of abandoned operations (a queue failing behind a rank that never posts) is
/// remembered whole: the first of them, which a peer's barrier may still be asking about, is
/// answered as failed, not as ended (which would make the asking rank blame itself). Runs of
/// another culprit, or broken by a skipped id, stay apart.
#[test]
fn a_burst_of_abandoned_operations_is_answered_as_failed_from_its_first() {
    let mut n = Node::new(Config::new(1, 3)).unwrap();
    for op in 0..500 {
        assert_eq!(n.abandon_op(Rank(2)).0, op);
    }
    assert_eq!(n.skip_op().0, 500);
    assert_eq!(n.abandon_op(Rank(0)).0, 501);
    assert_eq!(n.abandon_op(Rank(2)).0, 502);
    for (op, want) in [
        (0, Standing::EndedAfter(2)),
        (250, Standing::EndedAfter(2)),
        (499, Standing::EndedAfter(2)),
        (500, Standing::EndedApart),
        (501, Standing::EndedAfter(0)),
        (502, Standing::EndedAfter(2)),
        (503, Standing::NotPostedAfter(2)),
    ] {
        assert_eq!(asked(&mut n, op), [(Rank(0), here(op, want))], "op {op}");
    }
}

#[test]
fn a_failure_over_another_path_is_told_until_the_next_post() {
    // Operation 1 ran over another path (ringcast's TCP one) and failed there naming rank 2:
    // asked about operation 2, not posted, the rank says its program may have stopped over
    // rank 2, as after a failure of its own. Not for an operation that ran here, a culprit
    // that is this rank, or once it posted again.
    let mut n = Node::new(Config::new(1, 3)).unwrap();
    assert_eq!(n.abandon_op(Rank(0)).0, 0);
    n.failed_elsewhere(ringcast_core::OpId(0), Rank(2));
    assert_eq!(
        asked(&mut n, 1),
        [(Rank(0), here(1, Standing::NotPostedAfter(0)))]
    );
    assert_eq!(n.skip_op().0, 1);
    assert_eq!(asked(&mut n, 2), [(Rank(0), here(2, Standing::NotPosted))]);
    n.failed_elsewhere(ringcast_core::OpId(1), Rank(1));
    assert_eq!(asked(&mut n, 2), [(Rank(0), here(2, Standing::NotPosted))]);
    n.failed_elsewhere(ringcast_core::OpId(1), Rank(2));
    assert_eq!(
        asked(&mut n, 2),
        [(Rank(0), here(2, Standing::NotPostedAfter(2)))]
    );
    // Operation 1 itself still ran elsewhere.
    assert_eq!(asked(&mut n, 1), [(Rank(0), here(1, Standing::EndedApart))]);
    assert_eq!(n.skip_op().0, 2);
    n.failed_elsewhere(ringcast_core::OpId(1), Rank(2));
    assert_eq!(asked(&mut n, 3), [(Rank(0), here(3, Standing::NotPosted))]);
}

#[test]
fn a_rank_with_a_post_waiting_to_start_did_not_stop_over_its_failure() {
    // The last operation failed naming rank 0; the next one is posted but waits for room
    // (held by the caller while `can_start` says no): asked about it, the rank says it has
    // not posted it (waited for), not that its program may have stopped over rank 0.
    let mut n = Node::new(Config::new(1, 3)).unwrap();
    assert_eq!(n.abandon_op(Rank(0)).0, 0);
    assert_eq!(
        asked(&mut n, 1),
        [(Rank(0), here(1, Standing::NotPostedAfter(0)))]
    );
    n.set_queued(true);
    assert_eq!(asked(&mut n, 1), [(Rank(0), here(1, Standing::NotPosted))]);
    n.set_queued(false);
    assert_eq!(
        asked(&mut n, 1),
        [(Rank(0), here(1, Standing::NotPostedAfter(0)))]
    );
}

/// A leaf posts 10 peer timeouts late, past a post timeout of 4: the others fail the
/// operation naming it, and tell it (it is alive); its own operation fails at once when it
/// posts it, naming itself as the rank the hub gave up on. (Untold, it asked the hub, heard
/// that the hub had ended the operation, and asked again forever.)
#[test]
fn a_rank_that_posts_after_the_post_timeout_fails_at_once() {
    for late in [2, 0] {
        let mut net = net_with(4, 4 * PT);
        for r in (0..4).filter(|&r| r != late) {
            net.start_rank(0, r, Start::Broadcast { root: 0, len: LEN });
        }
        net.start_rank(10 * PT, late, Start::Broadcast { root: 0, len: LEN });
        net.run(200_000);
        let t = trace(&net);
        assert!(net.errors.is_empty(), "{:?}\n{t}", net.errors);
        for r in 0..4 {
            let o = net.outcome(r, 0);
            assert!(
                matches!(o, Outcome::Failed(e) if e.peer() == Rank(late)),
                "late r{late}: r{r}: {o:?}\n{t}"
            );
        }
        let at = net.failed_at[late as usize][&0];
        assert_eq!(at, 10 * PT, "late r{late}: failed at {at}\n{t}");
    }
}

/// Op 0 fails everywhere as a disagreement (rank 3 posts another length): the programs go
/// on. Op 1 is right everywhere, and rank 2 posts it 10 peer timeouts late: it is waited
/// for, and op 1 completes. (Rank 2's answer once named rank 3, its last failure's
/// culprit, and the hub failed op 1 over rank 3, which had posted it.)
#[test]
fn a_late_rank_after_a_disagreement_is_waited_for() {
    let mut net = net(4);
    for r in 0..4 {
        let len = if r == 3 { 2 * LEN } else { LEN };
        net.start_rank(0, r, Start::Broadcast { root: 0, len });
    }
    for r in [0, 1, 3] {
        net.start_rank(5 * PT, r, Start::Broadcast { root: 0, len: LEN });
    }
    net.start_rank(15 * PT, 2, Start::Broadcast { root: 0, len: LEN });
    net.run(2_000_000);
    let t = trace(&net);
    for r in 0..4 {
        let o = net.outcome(r, 0);
        assert!(
            matches!(o, Outcome::Failed(OpError::ShapeMismatch { .. })),
            "op 0 r{r}: {o:?}\n{t}"
        );
        let o = net.outcome(r, 1);
        assert!(matches!(o, Outcome::Completed(_)), "op 1 r{r}: {o:?}\n{t}");
    }
}

/// Rank 2 fails operation 0 before starting it (a peer it needs is gone: `abandon_op`, as
/// the engine does for a post doomed by a lost peer); the others run it. Asked where it
/// stands, rank 2 says it failed the operation naming the lost rank: the others fail it
/// then (the hub at its first question, the others told by the hub), naming the lost rank,
/// not at the post timeout naming rank 2 (which answered every question).
#[test]
fn a_rank_that_abandoned_the_operation_says_so_when_asked() {
    let mut net = net(4);
    net.start_rank(0, 2, Start::Abandon(3));
    for r in [0, 1, 3] {
        net.start_rank(1_000, r, Start::Broadcast { root: 0, len: LEN });
    }
    net.run(2_000_000);
    let t = trace(&net);
    assert!(t.contains("standing: EndedAfter(3)"), "{t}");
    for r in [0, 1, 3] {
        let o = net.outcome(r, 0);
        assert!(
            matches!(o, Outcome::Failed(e) if e.peer() == Rank(3)),
            "r{r}: {o:?}\n{t}"
        );
        let at = net.failed_at[r as usize][&0];
        assert!(at < 3 * PT, "r{r} at {at}\n{t}");
    }
}

/// A rank in the barrier that asks the hub and hears that the hub ended the operation stops
/// waiting: over the rank the hub's failure named, or over itself when the hub ended it
/// without it (the hub gave up on it and did not tell it).
#[test]
fn an_answer_that_the_operation_ended_ends_the_wait() {
    for (standing, want) in [
        (
            Standing::EndedAfter(2),
            OpError::PeerFailed {
                peer: Rank(2),
                reported_by: Rank(0),
            },
        ),
        (
            Standing::Ended,
            OpError::PeerFailed {
                peer: Rank(1),
                reported_by: Rank(0),
            },
        ),
    ] {
        let mut c = Config::new(1, 3);
        c.peer_timeout = Duration::from_millis(1);
        let mut n = Node::new(c).unwrap();
        let op = n.start_broadcast(Instant::ZERO, Rank(0), LEN).unwrap();
        let ready = sent(&mut n);
        assert_eq!(ready.len(), 1, "{ready:?}");
        // The wait for `Go` runs out: the hub is asked.
        let t = n.poll_timeout().expect("the wait for Go");
        n.handle_timeout(t);
        let q = format!("{:?}", ControlRepr::Where { op: op.0 });
        assert_eq!(sent(&mut n), [(Rank(0), q)]);
        n.handle_control(t, Rank(0), &bytes(ControlRepr::Here { op: op.0, standing }));
        let mut got = None;
        while let Some(e) = n.poll_event() {
            if let Event::Failed { error, .. } = e {
                got = Some(error);
            }
        }
        assert_eq!(got, Some(want), "{standing:?}");
    }
}

/// A rank's quota of early messages (for operations this rank has not started) gives way to
/// a lower id: one that sent `Ready`s for far-future ids (confused, or hostile with the job
/// nonce) does not crowd out its `Ready` for the next operation, which the hub then has when
/// it starts it, and answers with `Go` at once (it waited its timers out, then failed it).
#[test]
fn far_future_readies_do_not_crowd_out_the_next_operation_s() {
    let mut n = Node::new(Config::new(0, 3)).unwrap();
    let window = u64::from(n.config().limits.max_inflight_ops);
    let shape = ringcast_core::broadcast_shape(Rank(0), LEN);
    for op in 1000..1000 + window {
        n.handle_control(
            Instant::ZERO,
            Rank(2),
            &bytes(ControlRepr::Ready { op, shape }),
        );
    }
    for from in [1, 2] {
        let ready = bytes(ControlRepr::Ready { op: 0, shape });
        n.handle_control(Instant::ZERO, Rank(from), &ready);
    }
    n.start_broadcast(Instant::from_nanos(10), Rank(0), LEN)
        .unwrap();
    let go: Vec<Rank> = sent(&mut n)
        .into_iter()
        .filter(|(_, m)| m.starts_with("Go"))
        .map(|(to, _)| to)
        .collect();
    assert_eq!(go, [Rank(1), Rank(2)]);
}
