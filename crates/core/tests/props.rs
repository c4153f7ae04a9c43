//! Property tests: for random communicators, sizes, chunk sizes and fault mixes, every
//! surviving rank ends with the root's exact buffer, or fails with a typed error naming the
//! crashed peer. Nothing hangs (the network panics past a bounded number of steps).

mod util;

use proptest::prelude::*;
use ringcast_core::Rank;
use ringcast_core::wire::{ChunkRun, ControlRepr, RunList};
use util::{Net, Outcome, Rng};

#[derive(Debug, Clone)]
enum Pattern {
    Random,
    LeafGetsNothing(u32),
    SameChunkEverywhere(u32),
    OverlappingChain,
    /// Every chunk of the first operation arrives again, late, while a second one runs.
    StaleReplay,
    /// The root's uplink drops 4 consecutive chunks of its block: every leaf misses them.
    RootUplink(u32),
    /// Every leaf misses every `n`-th chunk of every block (gaps behind the stream, found
    /// and recovered during the fast path, with predecessors that lack them too).
    EveryNth(u32),
    /// One rank misses the last chunk of every block (no later chunk shows the gap).
    Tails(u32),
}

fn pattern() -> impl Strategy<Value = Pattern> {
    prop_oneof![
        3 => Just(Pattern::Random),
        1 => (0u32..64).prop_map(Pattern::LeafGetsNothing),
        1 => (0u32..64).prop_map(Pattern::SameChunkEverywhere),
        1 => Just(Pattern::OverlappingChain),
        1 => Just(Pattern::StaleReplay),
        2 => (0u32..64).prop_map(Pattern::RootUplink),
        1 => (3u32..40).prop_map(Pattern::EveryNth),
        1 => (0u32..64).prop_map(Pattern::Tails),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    ranks: u32,
    root: u32,
    len: u64,
    chunk: u32,
    lanes: u16,
    loss: f64,
    dup: f64,
    jitter_ns: u64,
    pattern: Pattern,
    crash: Option<(u32, u64)>,
    hostile: bool,
    seed: u64,
    /// `Some(sizes)`: an Allgatherv instead of a Broadcast.
    allgather: Option<Vec<u64>>,
    chains: u32,
}

fn case() -> impl Strategy<Value = Case> {
    (
        2u32..64,
        0u64..40_000,
        6u32..13,
        1u16..4,
        prop_oneof![Just(0.0), 0.0..0.3f64],
    )
        .prop_flat_map(|(ranks, len, chunk_log, lanes, loss)| {
            let faults = (
                prop_oneof![Just(0.0), 0.0..0.2f64],
                prop_oneof![Just(0u64), 0u64..50_000],
                pattern(),
                proptest::option::weighted(0.2, (0..ranks, 0u64..200_000)),
                proptest::bool::weighted(0.2),
            );
            let sizes =
                proptest::collection::vec(prop_oneof![Just(0u64), 0u64..6_000], ranks as usize);
            let shape = (
                0..ranks,
                proptest::option::weighted(0.4, sizes),
                1..=ranks,
                any::<u64>(),
            );
            (faults, shape).prop_map(
                move |(
                    (dup, jitter_ns, pattern, crash, hostile),
                    (root, allgather, chains, seed),
                )| {
                    Case {
                        ranks,
                        root,
                        len,
                        chunk: 1 << chunk_log,
                        lanes,
                        loss,
                        dup,
                        jitter_ns,
                        pattern,
                        crash,
                        hostile,
                        seed,
                        allgather,
                        chains,
                    }
                },
            )
        })
}

fn run_case(c: &Case) -> Result<(), TestCaseError> {
    let mut net = Net::new(c.ranks, |cfg| {
        cfg.chunk_size = c.chunk;
        cfg.lanes = c.lanes;
        cfg.chains = c.chains;
    });
    net.rng = Rng::new(c.seed);
    net.faults.loss = c.loss;
    net.faults.dup = c.dup;
    net.faults.jitter_ns = c.jitter_ns;
    let p = c.ranks;
    match c.pattern {
        Pattern::Random | Pattern::StaleReplay => {}
        Pattern::LeafGetsNothing(l) => net
            .faults
            .rules
            .push(Box::new(move |_, _, _, to| to == l % p)),
        Pattern::SameChunkEverywhere(k) => {
            net.faults.rules.push(Box::new(move |_, _, ch, _| ch == k))
        }
        Pattern::RootUplink(first) => {
            // In an Allgather, the uplink of rank `c.root`.
            let root = c.root;
            net.faults.rules.push(Box::new(move |_, r, ch, _| {
                r == root && (first..first + 4).contains(&ch)
            }))
        }
        Pattern::EveryNth(n) => net
            .faults
            .rules
            .push(Box::new(move |_, _, ch, _| ch % n == n - 1)),
        Pattern::Tails(l) => {
            let (sizes, chunk) = (block_sizes(c), u64::from(c.chunk));
            net.faults.rules.push(Box::new(move |_, root, ch, to| {
                let chunks = sizes[root as usize].div_ceil(chunk);
                to == l % p && chunks > 0 && u64::from(ch) == chunks - 1
            }))
        }
        Pattern::OverlappingChain => {
            // Relative to each chunk's own root, so it bites in an Allgather too.
            net.faults.rules.push(Box::new(move |_, root, ch, to| {
                let pos = (to + p - root) % p;
                (1..=4).contains(&pos) && (ch / 3 == pos || ch / 3 == pos + 1)
            }))
        }
    }
    if let Some(crash) = c.crash {
        net.faults.crash.push(crash);
    }
    match &c.allgather {
        Some(sizes) => net.allgather_at(0, 50, sizes.clone()),
        None => net.broadcast_at(0, 50, c.root, c.len),
    }
    if matches!(c.pattern, Pattern::StaleReplay) {
        net.faults.replay_after_ns = Some(60_000);
        net.broadcast_at(40_000, 10, (c.root + 1) % p, c.len.max(1));
    }
    if c.hostile {
        inject_hostile(&mut net, c.seed, c.root);
    }
    net.run(5_000_000);
    prop_assert!(net.errors.is_empty(), "{:?}", net.errors);
    let victim = c.crash.map(|(r, _)| r);
    let ops: Vec<u64> = net.ops.keys().copied().collect();
    for (r, op) in (0..p)
        .filter(|r| Some(*r) != victim)
        .flat_map(|r| ops.iter().map(move |o| (r, *o)))
    {
        match net.outcome(r, op) {
            Outcome::Completed(_) => {}
            Outcome::Failed(e) => {
                prop_assert!(victim.is_some(), "r{} failed without a crash: {:?}", r, e);
                prop_assert_eq!(
                    e.peer(),
                    Rank(victim.unwrap_or(u32::MAX)),
                    "r{} blames wrongly",
                    r
                );
            }
            Outcome::Pending => prop_assert!(false, "r{} hangs in op {}", r, op),
        }
    }
    if matches!(c.pattern, Pattern::RootUplink(_)) && c.crash.is_none() && c.loss == 0.0 {
        // Ranks whose predecessor lacks the chunks too probe further back: no chunk passes
        // through more than log2(P) ranks' recovery (the ring alone walked up to P - 2).
        let depth = net
            .sessions
            .iter()
            .map(|s| s.stats().max_fetch_depth)
            .max()
            .unwrap_or(0);
        let bound = 32 - (p - 1).leading_zeros();
        prop_assert!(depth <= bound, "depth {} > log2({})", depth, p);
    }
    // An empty first operation has no chunk to replay.
    if matches!(c.pattern, Pattern::StaleReplay) && c.crash.is_none() && c.len > 0 {
        let replayed: u64 = net
            .sessions
            .iter()
            .map(|s| s.stats().dropped_stale + s.stats().dropped_duplicate)
            .sum();
        let sent: u64 = net.sessions.iter().map(|s| s.stats().chunks_sent).sum();
        prop_assert!(sent == 0 || replayed > 0, "replays of op 0 were never seen");
    }
    Ok(())
}

/// Bytes of each rank's block in the case's operation.
fn block_sizes(c: &Case) -> Vec<u64> {
    match &c.allgather {
        Some(sizes) => sizes.clone(),
        None => (0..c.ranks)
            .map(|r| if r == c.root { c.len } else { 0 })
            .collect(),
    }
}

/// Well-formed but unwarranted control messages from random peers: they must be ignored.
fn inject_hostile(net: &mut Net, seed: u64, root: u32) {
    let p = net.ranks();
    let mut rng = Rng::new(seed ^ 0x5eed);
    let runs = [ChunkRun { start: 0, len: 2 }, ChunkRun { start: 5, len: 1 }];
    for _ in 0..20 {
        let op = rng.below(3);
        let (from, to) = (
            rng.below(u64::from(p)) as u32,
            rng.below(u64::from(p)) as u32,
        );
        let (pred, succ) = ((to + p - 1) % p, (to + 1) % p);
        let msg = match rng.below(6) {
            0 => ControlRepr::Fin { op },
            5 => ControlRepr::Lacking { op },
            1 => ControlRepr::FetchAck {
                op,
                runs: RunList::Slice(&runs),
                hops: 7,
            },
            2 => ControlRepr::Go { op },
            3 => ControlRepr::FetchNack { op },
            _ => ControlRepr::Fetch {
                op,
                runs: RunList::Slice(&runs),
            },
        };
        // Peers are trusted on the control path: inject only what no correct peer could send
        // from that position (e.g. a Fin from a rank that is not our successor).
        // A rank a skip distance ahead may probe us (Fetch) and then owes us a Fin; one a
        // skip distance behind may answer our probe (FetchAck).
        let (ahead, behind) = ((from + p - to) % p, (to + p - from) % p);
        let legit = match msg {
            ControlRepr::Fin { .. } | ControlRepr::Fetch { .. } => from == succ || is_skip(ahead),
            ControlRepr::FetchAck { .. } => from == pred || is_skip(behind),
            ControlRepr::FetchNack { .. } | ControlRepr::Lacking { .. } => from == pred,
            _ => from == root,
        };
        if legit {
            continue;
        }
        let mut bytes = Vec::new();
        msg.emit_vec(&mut bytes).expect("valid");
        net.inject_control(rng.below(100_000), from, to, bytes);
    }
}

/// The ring's skip distances (`m * 8^k`, `m` in `1..8`, at least 2): ranks that far apart
/// may probe.
fn is_skip(d: u32) -> bool {
    let mut x = d;
    while x >= 8 && x.is_multiple_of(8) {
        x /= 8;
    }
    d >= 2 && x < 8
}

/// 96 cases by default; `PROPTEST_CASES` asks for a longer campaign.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

/// A program of back-to-back operations on every rank, one rank hung (its control cut, as
/// an nft drop does, its multicast still flowing) or crashed at some moment.
#[derive(Debug, Clone)]
struct Seq {
    ranks: u32,
    ops: Vec<util::Start>,
    victim: u32,
    at: u64,
    crash: bool,
    loss: f64,
    gap_ns: u64,
    seed: u64,
    /// A rank that posts every operation this many ns after the others would (up to eight
    /// peer timeouts): alive and late, never to blame.
    slow: Option<(u32, u64)>,
}

fn seq() -> impl Strategy<Value = Seq> {
    (3u32..8, 2usize..6).prop_flat_map(|(ranks, n)| {
        let op = prop_oneof![
            (0..ranks, 0u64..60_000).prop_map(|(root, len)| util::Start::Broadcast { root, len }),
            proptest::collection::vec(prop_oneof![Just(0u64), 0u64..20_000], ranks as usize)
                .prop_map(|sizes| util::Start::Allgather { sizes }),
        ];
        (
            proptest::collection::vec(op, n),
            0..ranks,
            0u64..400_000,
            proptest::bool::weighted(0.3),
            prop_oneof![Just(0.0), 0.0..0.05f64],
            0u64..20_000,
            any::<u64>(),
            proptest::option::weighted(0.4, (0..ranks, 0u64..8_000_000)),
        )
            .prop_map(
                move |(ops, victim, at, crash, loss, gap_ns, seed, slow)| Seq {
                    ranks,
                    ops,
                    victim,
                    at,
                    crash,
                    loss,
                    gap_ns,
                    seed,
                    slow,
                },
            )
    })
}

/// Every survivor completes each operation it started with the exact buffer or fails it
/// naming the victim; none hangs.
fn run_seq(c: &Seq) -> Result<(), TestCaseError> {
    let mut net = Net::new(c.ranks, |_| {});
    net.rng = Rng::new(c.seed);
    net.faults.loss = c.loss;
    if c.crash {
        net.faults.crash.push((c.victim, c.at));
    } else {
        net.faults.control_cut.push((c.victim, c.at));
    }
    net.slow = c.slow;
    net.sequence(c.ops.clone(), 50, c.gap_ns);
    net.run(5_000_000);
    prop_assert!(net.errors.is_empty(), "{:?}", net.errors);
    for r in (0..c.ranks).filter(|r| *r != c.victim) {
        for (&op, o) in &net.outcomes[r as usize] {
            match o {
                Outcome::Completed(_) => {}
                Outcome::Failed(e) => {
                    prop_assert_eq!(e.peer(), Rank(c.victim), "r{} op {} blames wrongly", r, op)
                }
                Outcome::Pending => prop_assert!(false, "r{} hangs in op {}", r, op),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn every_surviving_rank_gets_the_root_buffer(c in case()) {
        run_case(&c)?;
    }

    #[test]
    fn back_to_back_operations_name_a_rank_that_hangs_or_crashes(c in seq()) {
        run_seq(&c)?;
    }
}
