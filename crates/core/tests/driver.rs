//! A driver that misroutes the lanes' notes (a queue bug in an engine that runs its lanes on
//! threads of their own), or asks for absurd sizes: the session drops what cannot be its
//! own and never completes an operation whose bytes it did not see arrive.

use ringcast_core::Transmit;
use ringcast_core::lane::{LaneCommand, LaneNote, LaneRx, LaneTx, RxNote, TxCommand};
use ringcast_core::{ChunkRun, Config, Event, Instant, Node, OpId, Rank, Session, StartError};

fn config(rank: u32, lanes: u16) -> Config {
    let mut c = Config::new(rank, 2);
    c.lanes = lanes;
    c.chunk_size = 16;
    c
}

/// A leaf as these tests drive it: a whole `Node`, or a `Session` whose lanes they drive.
trait Leaf {
    fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit>;
    fn handle_control(&mut self, now: Instant, from: Rank, bytes: &[u8]);
    fn handle_read_done(&mut self, now: Instant, id: ringcast_core::ReadId);
}

impl Leaf for Node {
    fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        Node::poll_transmit(self, buf)
    }
    fn handle_control(&mut self, now: Instant, from: Rank, bytes: &[u8]) {
        Node::handle_control(self, now, from, bytes);
    }
    fn handle_read_done(&mut self, now: Instant, id: ringcast_core::ReadId) {
        Node::handle_read_done(self, now, id, Ok(()));
    }
}

impl Leaf for Session {
    fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        Session::poll_transmit(self, buf)
    }
    fn handle_control(&mut self, now: Instant, from: Rank, bytes: &[u8]) {
        Session::handle_control(self, now, from, bytes);
    }
    fn handle_read_done(&mut self, now: Instant, id: ringcast_core::ReadId) {
        Session::handle_read_done(self, now, id, Ok(()));
    }
}

/// Moves control messages both ways between a root `Node` (rank 0) and a leaf (rank 1)
/// until none is left; reads the leaf asks for succeed (the root holds every byte) and are
/// recorded with their operation, offset and length.
fn exchange(root: &mut Node, leaf: &mut impl Leaf, now: Instant, read: &mut Vec<(OpId, u64, u64)>) {
    let mut buf = Vec::new();
    loop {
        let mut moved = false;
        while let Some(t) = leaf.poll_transmit(&mut buf) {
            moved = true;
            match t {
                Transmit::Control { len, .. } => {
                    let msg = buf[..len].to_vec();
                    root.handle_control(now, Rank(1), &msg);
                }
                Transmit::Read(r) => {
                    read.push((r.op, r.offset, r.len));
                    leaf.handle_read_done(now, r.id);
                }
                _ => {}
            }
        }
        while let Some(t) = root.poll_transmit(&mut buf) {
            moved = true;
            if let Transmit::Control { len, .. } = t {
                let msg = buf[..len].to_vec();
                leaf.handle_control(now, Rank(0), &msg);
            }
        }
        if !moved {
            return;
        }
    }
}

/// Moves a leaf `Node`'s control messages (rank 1) to a root `Session` (rank 0), and
/// completes the reads the leaf asks for (the root holds every byte).
fn leaf_to_root(leaf: &mut Node, root: &mut Session, now: Instant, buf: &mut Vec<u8>) {
    while let Some(t) = leaf.poll_transmit(buf) {
        match t {
            Transmit::Control { len, .. } => {
                let msg = buf[..len].to_vec();
                root.handle_control(now, Rank(1), &msg);
            }
            Transmit::Read(r) => leaf.handle_read_done(now, r.id, Ok(())),
            _ => {}
        }
    }
}

/// Moves a root `Session`'s control messages (rank 0) to a leaf `Node` (rank 1), then fires
/// both ranks' due timers.
fn root_to_leaf(root: &mut Session, leaf: &mut Node, now: Instant, buf: &mut Vec<u8>) {
    while let Some(Transmit::Control { len, .. }) = root.poll_transmit(buf) {
        let msg = buf[..len].to_vec();
        leaf.handle_control(now, Rank(0), &msg);
    }
    root.handle_timeout(now);
    leaf.handle_timeout(now);
}

#[test]
fn chunk_counts_past_2_to_the_64_are_too_large_not_an_overflow() {
    let mut c = Config::new(0, 2);
    c.chunk_size = 1;
    let mut s = Session::new(c).expect("config");
    let r = s.start_allgather(Instant::ZERO, &[u64::MAX, u64::MAX]);
    assert!(matches!(r, Err(StartError::TooLarge { .. })), "{r:?}");
    let mut s = Session::new(Config::new(0, 3)).expect("config");
    let r = s.start_allgather(Instant::ZERO, &[u64::MAX; 3]);
    assert!(matches!(r, Err(StartError::TooLarge { .. })), "{r:?}");
    assert_eq!(s.inflight(), 0);
}

/// Notes naming a lane the session does not have: dropped (a `Settled` one indexed the
/// layout out of bounds), and the operation goes on.
#[test]
fn notes_from_a_lane_that_does_not_exist_are_dropped() {
    let mut root = Node::new(config(0, 2)).expect("config");
    let mut leaf = Session::new(config(1, 2)).expect("config");
    let op = root
        .start_broadcast(Instant::ZERO, Rank(0), 160)
        .expect("start");
    leaf.start_broadcast(Instant::ZERO, Rank(0), 160)
        .expect("start");
    exchange(&mut root, &mut leaf, Instant::ZERO, &mut Vec::new());
    for note in [
        RxNote::Settled {
            lane: 7,
            op,
            block: Rank(0),
            run: ChunkRun { start: 0, len: 1 },
            missing: vec![],
        },
        RxNote::Full { lane: 2, op },
        RxNote::Started {
            lane: 9,
            op,
            block: Rank(0),
        },
    ] {
        leaf.handle_lane_note(Instant::ZERO, LaneNote::Rx(note));
    }
    assert_eq!(leaf.poll_event(), None);
    assert_eq!(leaf.inflight(), 1);
}

/// A root on two lanes whose lane 0 reports its sends done twice, while lane 1's multicasts
/// are still posted: not done (its buffer must stay untouched until lane 1's are out too).
#[test]
fn a_lane_that_says_its_sends_are_done_twice_does_not_end_the_others() {
    let mut root = Session::new(config(0, 2)).expect("config");
    let mut leaf = Node::new(config(1, 2)).expect("config");
    let mut tx: Vec<LaneTx> = (0..2).map(|l| LaneTx::new(root.config(), l)).collect();
    let mut rx: Vec<LaneRx> = (0..2).map(|l| LaneRx::new(root.config(), l)).collect();
    let op = root
        .start_broadcast(Instant::ZERO, Rank(0), 1600)
        .expect("start");
    leaf.start_broadcast(Instant::ZERO, Rank(0), 1600)
        .expect("start");
    let mut buf = Vec::new();
    let mut lane1_posted = 0u32;
    let mut done = false;
    for step in 0..200u64 {
        let now = Instant::from_nanos(step * 100_000);
        // From step 50 on, lane 1's multicasts leave too.
        let lane1_out = step >= 50;
        leaf_to_root(&mut leaf, &mut root, now, &mut buf);
        while let Some(c) = root.poll_lane_command() {
            match c {
                LaneCommand::Rx { lane, cmd } => rx[lane as usize].handle_command(cmd),
                LaneCommand::Tx { lane, cmd } => tx[lane as usize].handle_command(cmd),
                _ => {}
            }
        }
        while let Some(m) = tx[0].poll_multicast() {
            tx[0].handle_send_done(m.op, 1);
        }
        while tx[1].poll_multicast().is_some() {
            lane1_posted += 1;
        }
        if lane1_out && lane1_posted > 0 {
            tx[1].handle_send_done(op, lane1_posted);
            lane1_posted = 0;
        }
        while let Some(n) = tx[0].poll_note() {
            // Forwarded twice.
            let n: LaneNote = n.into();
            root.handle_lane_note(now, n.clone());
            root.handle_lane_note(now, n);
        }
        while let Some(n) = tx[1].poll_note() {
            root.handle_lane_note(now, n.into());
        }
        for r in &mut rx {
            while let Some(n) = r.poll_note() {
                root.handle_lane_note(now, n.into());
            }
        }
        root_to_leaf(&mut root, &mut leaf, now, &mut buf);
        if let Some(ev) = root.poll_event() {
            assert!(
                lane1_out,
                "step {step}: {ev:?} with lane 1's multicasts still posted"
            );
            assert_eq!(ev, Event::Completed { op });
            done = true;
            break;
        }
    }
    assert!(done, "the root completes once every lane's sends are out");
}

/// Two operations' `Closed` notes swapped: each bitmap is of the other's length, so neither
/// is taken. The 3 200-byte operation, none of whose multicasts arrived, completes only
/// after reading every byte, never on the 16-byte one's bitmap.
#[test]
fn a_closed_note_with_another_operations_bitmap_is_not_taken() {
    let mut root = Node::new(config(0, 1)).expect("config");
    let mut leaf = Session::new(config(1, 1)).expect("config");
    let mut rx = LaneRx::new(leaf.config(), 0);
    let a = root
        .start_broadcast(Instant::ZERO, Rank(0), 16 * 200)
        .expect("start");
    let b = root
        .start_broadcast(Instant::ZERO, Rank(0), 16)
        .expect("start");
    leaf.start_broadcast(Instant::ZERO, Rank(0), 16 * 200)
        .expect("start");
    leaf.start_broadcast(Instant::ZERO, Rank(0), 16)
        .expect("start");
    let mut read = Vec::new();
    let mut closed: Vec<RxNote> = Vec::new();
    for step in 0..400u64 {
        let now = Instant::from_nanos(step * 50_000);
        while let Some(c) = leaf.poll_lane_command() {
            if let LaneCommand::Rx { cmd, .. } = c {
                rx.handle_command(cmd);
            }
        }
        while let Some(n) = rx.poll_note() {
            match n {
                RxNote::Closed { .. } => closed.push(n),
                n => leaf.handle_lane_note(now, n.into()),
            }
        }
        // Both in: handed over with their operations swapped.
        if closed.len() == 2 {
            for n in closed.drain(..) {
                if let RxNote::Closed { lane, op, bitmap } = n {
                    let op = if op == a { b } else { a };
                    leaf.handle_lane_note(now, RxNote::Closed { lane, op, bitmap }.into());
                }
            }
        }
        exchange(&mut root, &mut leaf, now, &mut read);
        // Every multicast is lost.
        while let Some(m) = root.poll_multicast() {
            root.handle_send_done(now, m.lane, m.op, 1);
        }
        while let Some(e) = leaf.poll_event() {
            if e == (Event::Completed { op: a }) {
                let got: u64 = read.iter().filter(|r| r.0 == a).map(|r| r.2).sum();
                assert_eq!(got, 16 * 200, "completed {a:?} having read {got} bytes");
            }
        }
        leaf.handle_timeout(now);
        root.handle_timeout(now);
    }
}

/// A driver that commits chunks it was never given (a leaf that received nothing): the lane
/// does not say `Full` on the count alone, so the operation completes only after reading
/// every byte it lacks, never with a buffer of zeros.
#[test]
fn commits_without_chunks_do_not_complete_an_operation() {
    let mut root = Node::new(config(0, 1)).expect("config");
    let mut leaf = Node::new(config(1, 1)).expect("config");
    let op = root
        .start_broadcast(Instant::ZERO, Rank(0), 64)
        .expect("start");
    leaf.start_broadcast(Instant::ZERO, Rank(0), 64)
        .expect("start");
    let mut read = Vec::new();
    let mut done = false;
    for step in 0..400u64 {
        let now = Instant::from_nanos(step * 50_000);
        exchange(&mut root, &mut leaf, now, &mut read);
        // Every multicast is lost; the leaf's driver commits one chunk for each anyway.
        while let Some(m) = root.poll_multicast() {
            root.handle_send_done(now, m.lane, m.op, 1);
            leaf.commit(now, m.lane, op);
        }
        exchange(&mut root, &mut leaf, now, &mut read);
        if let Some(e) = leaf.poll_event() {
            assert_eq!(e, Event::Completed { op });
            let got: u64 = read.iter().map(|r| r.2).sum();
            assert_eq!(got, 64, "completed having read {got} of its 64 bytes");
            done = true;
            break;
        }
        leaf.handle_timeout(now);
        root.handle_timeout(now);
    }
    assert!(done, "the leaf completes by reading what it lacks");
}

/// A driver whose copy of one placed chunk fails releases it: the leaf does not count it
/// present, reads it from the root, and completes. Chunk 0 starts the block and 63 ends it
/// (both watch points, whose work waits for a commit that never comes); 1, 30 and 62 lie
/// between.
#[test]
fn a_released_chunk_is_read_again_before_the_operation_completes() {
    const CHUNKS: u64 = 64;
    for released in [0u64, 1, 30, 62, 63] {
        let mut root = Node::new(config(0, 1)).expect("config");
        let mut leaf = Node::new(config(1, 1)).expect("config");
        let op = root
            .start_broadcast(Instant::ZERO, Rank(0), 16 * CHUNKS)
            .expect("start");
        leaf.start_broadcast(Instant::ZERO, Rank(0), 16 * CHUNKS)
            .expect("start");
        let mut read = Vec::new();
        let mut done = false;
        for step in 0..400u64 {
            let now = Instant::from_nanos(step * 50_000);
            exchange(&mut root, &mut leaf, now, &mut read);
            while let Some(m) = root.poll_multicast() {
                root.handle_send_done(now, m.lane, m.op, 1);
                let p = leaf.handle_chunk(m.lane, Rank(0), m.imm, m.len as usize);
                assert!(matches!(p, ringcast_core::Placement::Place { .. }), "{p:?}");
                if u64::from(m.chunk) == released {
                    leaf.release(m.lane, Rank(0), m.imm);
                } else {
                    leaf.commit(now, m.lane, op);
                }
            }
            exchange(&mut root, &mut leaf, now, &mut read);
            if let Some(e) = leaf.poll_event() {
                assert_eq!(e, Event::Completed { op }, "chunk {released}");
                let at = released * 16;
                assert!(
                    read.iter().any(|r| r.1 <= at && at + 16 <= r.1 + r.2),
                    "chunk {released} completed without being read: {read:?}"
                );
                assert_eq!(leaf.stats().chunks_released, 1, "chunk {released}");
                done = true;
                break;
            }
            leaf.handle_timeout(now);
            root.handle_timeout(now);
        }
        assert!(done, "chunk {released}: the leaf completes by reading it");
    }
}

/// Drives a Broadcast root `Session` whose one lane's send completions come when `complete`
/// says (by step, and the multicasts posted and not completed), to a leaf `Node` that
/// receives every multicast as it is posted. Steps of 5 ms; returns the root's event and
/// the step it came at.
fn root_with_completions(
    chunks: u64,
    complete: impl FnMut(u64, u32) -> u32,
) -> Option<(Event, u64)> {
    root_with_completions_to(chunks, complete, |_| true, 0)
}

/// As [`root_with_completions`], the leaf receiving the multicasts `deliver` lets through
/// (by the count posted so far), and the send worker answering a look (`Count`) `lag`
/// steps late (a worker that waits in a send on a full socket buffer answers after it).
fn root_with_completions_to(
    chunks: u64,
    mut complete: impl FnMut(u64, u32) -> u32,
    mut deliver: impl FnMut(u32) -> bool,
    lag: u64,
) -> Option<(Event, u64)> {
    let peer_timeout = core::time::Duration::from_millis(100);
    let mut c0 = config(0, 1);
    c0.peer_timeout = peer_timeout;
    let mut c1 = config(1, 1);
    c1.peer_timeout = peer_timeout;
    let mut root = Session::new(c0).expect("config");
    let mut leaf = Node::new(c1).expect("config");
    let mut tx = LaneTx::new(root.config(), 0);
    let mut rx = LaneRx::new(root.config(), 0);
    let len = 16 * chunks;
    let op = root
        .start_broadcast(Instant::ZERO, Rank(0), len)
        .expect("start");
    leaf.start_broadcast(Instant::ZERO, Rank(0), len)
        .expect("start");
    let mut buf = Vec::new();
    let mut posted = 0u32;
    let mut sent_ever = 0u32;
    let mut looks = Vec::new();
    for step in 0..4000u64 {
        let now = Instant::from_nanos(step * 5_000_000);
        leaf_to_root(&mut leaf, &mut root, now, &mut buf);
        while let Some(c) = root.poll_lane_command() {
            match c {
                LaneCommand::Rx { cmd, .. } => rx.handle_command(cmd),
                LaneCommand::Tx {
                    cmd: cmd @ TxCommand::Count { .. },
                    ..
                } => looks.push((step + lag, cmd)),
                LaneCommand::Tx { cmd, .. } => tx.handle_command(cmd),
                _ => {}
            }
        }
        while looks.first().is_some_and(|(at, _)| *at <= step) {
            let (_, cmd) = looks.remove(0);
            tx.handle_command(cmd);
        }
        while let Some(m) = tx.poll_multicast() {
            posted += 1;
            sent_ever += 1;
            if !deliver(sent_ever) {
                continue;
            }
            if let ringcast_core::Placement::Place { .. } =
                leaf.handle_chunk(0, Rank(0), m.imm, m.len as usize)
            {
                leaf.commit(now, 0, op);
            }
        }
        let n = complete(step, posted).min(posted);
        if n > 0 {
            tx.handle_send_done(op, n);
            posted -= n;
        }
        while let Some(n) = tx.poll_note() {
            root.handle_lane_note(now, n.into());
        }
        while let Some(n) = rx.poll_note() {
            root.handle_lane_note(now, n.into());
        }
        root_to_leaf(&mut root, &mut leaf, now, &mut buf);
        if let Some(e) = root.poll_event() {
            return Some((e, step));
        }
    }
    None
}

/// Whether the root (rank 0) failed naming its own sends.
fn stalled(e: &Event) -> bool {
    matches!(
        e,
        Event::Failed {
            error: ringcast_core::OpError::SendsStalled { rank: Rank(0) },
            ..
        }
    )
}

/// A root whose transport never completes its multicasts (they left, the completions were
/// lost): it fails naming itself within a few peer timeouts, where it waited forever.
#[test]
fn a_root_whose_sends_never_complete_fails_naming_itself() {
    let (e, step) = root_with_completions(64, |_, _| 0).expect("the root ends");
    assert!(stalled(&e), "{e:?}");
    // Two looks a patience (a peer timeout, 100 ms, and the block's wire time) apart.
    assert!(step * 5 <= 400, "failed only after {} ms", step * 5);
}

/// A root whose completions come slowly but steadily (one every 60 ms, 64 of them: about
/// 4 s, many peer timeouts) is not stalled: it completes.
#[test]
fn a_root_whose_sends_complete_slowly_completes() {
    let (e, step) =
        root_with_completions(64, |step, _| u32::from(step % 12 == 11)).expect("the root ends");
    assert!(matches!(e, Event::Completed { .. }), "{e:?} at step {step}");
    assert!(step * 5 >= 3000, "completed at {} ms", step * 5);
}

/// Completions that pause for longer than a patience (150 ms, the peer timeout 100 ms)
/// fail the operation while they are paused, judged on the counts of that moment (a
/// verdict on the counts of the look before failed it after they had resumed); a pause
/// shorter than a patience (75 ms) fails nothing.
#[test]
fn the_sends_watch_judges_the_pause_while_it_lasts() {
    let (e, step) = root_with_completions(64, |step, _| u32::from(!(15..45).contains(&step)))
        .expect("the root ends");
    assert!(stalled(&e), "{e:?}");
    assert!(
        (15..45).contains(&step),
        "failed at step {step}, outside the pause"
    );
    // Every step but a pause of 15 (75 ms), wherever the looks fall.
    for from in [5, 15, 25] {
        let (e, step) =
            root_with_completions(64, |step, _| u32::from(!(from..from + 15).contains(&step)))
                .expect("the root ends");
        assert!(matches!(e, Event::Completed { .. }), "{e:?} at step {step}");
    }
}

/// A root whose NIC stops after some of its 64 multicasts (a PFC pause: the rest neither
/// leave nor complete) fails naming itself, wherever the pause falls and however late its
/// send worker answers the looks (one blocked in a send answers after it): the leaf, which
/// cannot finish without the rest (nor send `Fin`), is not blamed. Before, with looks
/// answered 10 ms late, the wait for the leaf's `Fin` ran out first and named the leaf.
#[test]
fn a_root_paused_mid_block_names_itself_not_the_leaf_waiting_on_it() {
    for (first, lag) in [8u32, 16, 40, 63]
        .into_iter()
        .flat_map(|f| [0, 2, 4].map(|l| (f, l)))
    {
        let mut completed = 0u32;
        let (e, step) = root_with_completions_to(
            64,
            |_, posted| {
                let n = posted.min(first.saturating_sub(completed));
                completed += n;
                n
            },
            |k| k <= first,
            lag,
        )
        .expect("the root ends");
        assert!(
            stalled(&e),
            "{first} sent, looks answered {lag} steps late: {e:?} at step {step}"
        );
    }
}

/// A rank that refuses its call (`refuse_op`) tells the others at once, naming itself: a
/// leaf that started the operation fails it at once, and so does one that starts it later.
#[test]
fn a_refused_call_fails_the_others_at_once_naming_the_refuser() {
    for leaf_first in [true, false] {
        let mut root = Node::new(config(0, 1)).expect("config");
        let mut leaf = Node::new(config(1, 1)).expect("config");
        let now = Instant::ZERO;
        if leaf_first {
            leaf.start_broadcast(now, Rank(0), 1600).expect("start");
        }
        let refused = root.refuse_op();
        exchange(&mut root, &mut leaf, now, &mut Vec::new());
        let op = if leaf_first {
            OpId(0)
        } else {
            leaf.start_broadcast(now, Rank(0), 1600).expect("start")
        };
        assert_eq!(op, refused, "the same id on both ranks");
        assert_eq!(
            leaf.poll_event(),
            Some(Event::Failed {
                op,
                error: ringcast_core::OpError::ShapeMismatch {
                    peer: Rank(0),
                    reported_by: Rank(0),
                },
            }),
            "leaf first: {leaf_first}"
        );
        // The next operation lines up.
        let a = root.start_broadcast(now, Rank(0), 16).expect("start");
        let b = leaf.start_broadcast(now, Rank(0), 16).expect("start");
        assert_eq!(a, b);
    }
}

/// The all-ones chunk index is never a chunk's: an operation of `2^chunk_bits` chunks is
/// refused (its last chunk would carry it), one chunk fewer runs, and a datagram carrying
/// that index (an engine's start-up probe, sized like a chunk) is dropped as out of range,
/// never placed.
#[test]
fn the_all_ones_chunk_index_is_never_a_chunk() {
    let imm = ringcast_core::wire::ImmLayout::new(8).expect("layout");
    let tweak = |rank| {
        let mut c = config(rank, 1);
        c.imm = imm;
        // As wide as the immediate indexes: the index still caps it.
        c.limits.max_chunks_per_op = 256;
        c
    };
    let mut leaf = Node::new(tweak(1)).expect("config");
    assert_eq!(
        leaf.start_broadcast(Instant::ZERO, Rank(0), 256 * 16),
        Err(StartError::TooLarge {
            chunks: 256,
            max: 255
        })
    );
    let op = leaf
        .start_broadcast(Instant::ZERO, Rank(0), 255 * 16)
        .expect("one chunk fewer runs");
    let probe = imm
        .encode(ringcast_core::wire::Imm {
            op_tag: imm.tag_of(op.0),
            chunk: 255,
        })
        .expect("fits");
    assert!(
        matches!(
            leaf.handle_chunk(0, Rank(0), probe, 16),
            ringcast_core::Placement::Drop(_)
        ),
        "the all-ones index is dropped"
    );
}
