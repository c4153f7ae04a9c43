//! `cargo xtask fuzz-seed`: the committed seed corpora under `fuzz/corpus/<target>/`.
//!
//! Seeds are valid inputs (encoded immediates, control messages of every kind, and session
//! scripts that run a Broadcast to completion) so that fuzzing starts from deep states instead of
//! rediscovering the formats. The session scripts follow the format documented at the top of
//! `fuzz/fuzz_targets/session.rs`.

use crate::run::StepError;
use ringcast_core::wire::{ChunkRun, ControlRepr, ImmLayout, RunList};
use ringcast_core::{Rank, broadcast_shape};
use std::path::Path;

/// Writes every seed file, replacing the `seed-*` files already there.
pub(crate) fn write_all(corpus: &Path) -> Result<(), StepError> {
    let sets = [
        ("imm", imm_seeds()),
        ("control", control_seeds()?),
        ("session", session_seeds()),
    ];
    for (target, seeds) in sets {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)
            .map_err(|e| StepError::Other(format!("cannot create {}: {e}", dir.display())))?;
        remove_old_seeds(&dir)?;
        for (name, bytes) in &seeds {
            let path = dir.join(format!("seed-{name}"));
            std::fs::write(&path, bytes)
                .map_err(|e| StepError::Other(format!("cannot write {}: {e}", path.display())))?;
        }
        eprintln!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}

fn remove_old_seeds(dir: &Path) -> Result<(), StepError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| StepError::Other(format!("cannot list {}: {e}", dir.display())))?;
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with("seed-") {
            std::fs::remove_file(e.path()).map_err(|err| {
                StepError::Other(format!("cannot remove {}: {err}", e.path().display()))
            })?;
        }
    }
    Ok(())
}

/// `chunk_bits u8, raw u32, op_tag u32, chunk u32`, little-endian.
fn imm_seeds() -> Vec<(String, Vec<u8>)> {
    let cases: [(u8, u32, u32, u32); 5] = [
        (20, 0x0010_0005, 1, 5),
        (22, u32::MAX, 1023, (1 << 22) - 1),
        (1, 0x8000_0001, 0, 1),
        (0, 7, 7, 7),
        (23, 0xdead_beef, 1 << 10, 1 << 22),
    ];
    cases
        .iter()
        .map(|&(bits, raw, tag, chunk)| {
            let mut v = vec![bits];
            for x in [raw, tag, chunk] {
                v.extend_from_slice(&x.to_le_bytes());
            }
            (format!("bits{bits}"), v)
        })
        .collect()
}

fn emit(repr: ControlRepr<'_>) -> Result<Vec<u8>, StepError> {
    let mut v = Vec::new();
    repr.emit_vec(&mut v)
        .map_err(|_| StepError::Other(format!("core refused to emit seed {repr:?}")))?;
    Ok(v)
}

fn control_seeds() -> Result<Vec<(String, Vec<u8>)>, StepError> {
    let runs = [
        ChunkRun { start: 0, len: 3 },
        ChunkRun { start: 10, len: 1 },
    ];
    let reprs = [
        ("ready", ControlRepr::Ready { op: 0, shape: 7 }),
        ("go", ControlRepr::Go { op: 1 }),
        (
            "fetch",
            ControlRepr::Fetch {
                op: 2,
                runs: RunList::Slice(&runs),
            },
        ),
        (
            "fetch-ack",
            ControlRepr::FetchAck {
                op: 2,
                runs: RunList::Slice(&runs[..1]),
                hops: 1,
            },
        ),
        ("fetch-nack", ControlRepr::FetchNack { op: 3 }),
        ("lacking", ControlRepr::Lacking { op: 3 }),
        ("fin", ControlRepr::Fin { op: u64::MAX }),
        ("abort", ControlRepr::Abort { op: 4, culprit: 1 }),
        ("mismatch", ControlRepr::Mismatch { op: 5, culprit: 2 }),
    ];
    reprs
        .into_iter()
        .map(|(name, r)| Ok((name.to_owned(), emit(r)?)))
        .collect()
}

/// Builds session scripts (see `fuzz/fuzz_targets/session.rs`).
struct Script(Vec<u8>);

impl Script {
    /// Header: ranks, rank, lanes, chunk size, 8 in flight, window 64, timeouts 100 us / 10 us.
    fn new(ranks: u8, rank: u8, lanes: u8, chunk_size: u16) -> Self {
        let mut v = vec![ranks - 2, rank, lanes - 1];
        v.extend_from_slice(&(chunk_size - 1).to_le_bytes());
        v.extend_from_slice(&[7, 63, 99, 10]);
        Script(v)
    }
    fn start(mut self, root: u8, len: u16) -> Self {
        self.0.push(0);
        self.0.push(root);
        self.0.extend_from_slice(&len.to_le_bytes());
        self
    }
    /// A chunk of started op number `op` with the right length.
    fn chunk(mut self, op: u8, chunk: u16, lane: u8, from: u8) -> Self {
        self.0.extend_from_slice(&[1, op]);
        self.0.extend_from_slice(&chunk.to_le_bytes());
        self.0.extend_from_slice(&[lane, from, 0]);
        self
    }
    /// As [`chunk`](Self::chunk), but the driver's copy of it fails (the pump releases it).
    fn failing_chunk(mut self, op: u8, chunk: u16, lane: u8, from: u8) -> Self {
        self.0.extend_from_slice(&[14, op]);
        self.0.extend_from_slice(&chunk.to_le_bytes());
        self.0.extend_from_slice(&[lane, from, 0]);
        self
    }
    /// A control message of `kind` (0 Ready, 1 Go, 2 Fetch, 3 FetchAck, 4 FetchNack, 5 Fin).
    fn control(self, from: u8, kind: u8, op: u8, runs: &[(u16, u16)]) -> Self {
        self.control_arg(from, kind, op, 0, runs)
    }
    /// [`control`](Self::control) with `arg` (a Ready's shape, an Abort's culprit, ...).
    fn control_arg(mut self, from: u8, kind: u8, op: u8, arg: u32, runs: &[(u16, u16)]) -> Self {
        self.0.extend_from_slice(&[4, from, kind, op]);
        self.0.extend_from_slice(&arg.to_le_bytes());
        self.0.push(runs.len() as u8);
        for &(s, l) in runs {
            self.0.extend_from_slice(&s.to_le_bytes());
            self.0.extend_from_slice(&l.to_le_bytes());
        }
        self
    }
    /// Reports the first read handed out and not reported yet (`which` 0), one never handed
    /// out (255) or the last one reported again (254).
    fn read_done(mut self, which: u8, ok: bool) -> Self {
        self.0.extend_from_slice(&[5, which, u8::from(ok)]);
        self
    }
    /// Reports `chunks` multicasts of the first op outstanding on `lane` sent.
    fn send_done(mut self, lane: u8, chunks: u8) -> Self {
        self.0.extend_from_slice(&[6, lane, 0, chunks]);
        self
    }
    /// Hands the node at most `budget` queued chunks per lane.
    fn pump(mut self, budget: u8) -> Self {
        self.0.extend_from_slice(&[9, budget]);
        self
    }
    /// An Allgatherv with one size per rank (`ranks` must match the header).
    fn allgather(mut self, sizes: &[u16]) -> Self {
        // `n` is read as `ranks - 1 + x % 3`: x = 1 gives exactly one size per rank.
        self.0.extend_from_slice(&[8, 1]);
        for s in sizes {
            self.0.extend_from_slice(&s.to_le_bytes());
        }
        self
    }
    fn next_timeout(mut self) -> Self {
        self.0.extend_from_slice(&[7, 1, 0, 0, 0, 0]);
        self
    }
    /// Skips `n` ids (operations that ran elsewhere).
    fn skip(mut self, n: u16) -> Self {
        self.0.push(10);
        self.0.extend_from_slice(&n.to_le_bytes());
        self
    }
    /// Says whether posts wait to start.
    fn queued(mut self, on: bool) -> Self {
        self.0.extend_from_slice(&[11, u8::from(on)]);
        self
    }
    /// The operation `back` ids before the last one taken failed elsewhere over `culprit`.
    fn failed_elsewhere(mut self, back: u16, culprit: u8) -> Self {
        self.0.push(12);
        self.0.extend_from_slice(&back.to_le_bytes());
        self.0.push(culprit);
        self
    }
    /// Fails the next operation without starting it, over `culprit`.
    fn abandon(mut self, culprit: u8) -> Self {
        self.0.extend_from_slice(&[13, culprit]);
        self
    }
}

fn session_seeds() -> Vec<(String, Vec<u8>)> {
    // Rank 1 of 3, leaf of a 4-chunk broadcast from rank 0: barrier, Go, every chunk, Fin.
    let mut leaf = Script::new(3, 1, 1, 1024)
        .start(0, 4096)
        .control(0, 1, 0, &[]);
    for c in 0..4 {
        leaf = leaf.chunk(0, c, 0, 0);
    }
    let leaf = leaf.control(2, 5, 0, &[]);

    // The same leaf misses chunk 2 (`lossy`), or its copy of chunk 2 fails and it releases
    // it (`failed_copy`): the cutoff fires, it fetches, the ACK comes, it reads.
    let missing_2 = |fails: bool| {
        let s = Script::new(3, 1, 1, 1024)
            .start(0, 4096)
            .control(0, 1, 0, &[])
            .chunk(0, 0, 0, 0)
            .chunk(0, 1, 0, 0);
        let s = if fails {
            s.failing_chunk(0, 2, 0, 0)
        } else {
            s
        };
        s.chunk(0, 3, 0, 0)
            .next_timeout()
            .control(0, 3, 0, &[(2, 1)])
            .read_done(0, true)
            .control(2, 5, 0, &[])
    };
    let (lossy, failed_copy) = (missing_2(false), missing_2(true));

    // Rank 0 of 2 is the root: Ready from the leaf, both lanes' sends complete, the leaf's Fin.
    let root = Script::new(2, 0, 2, 512)
        .start(0, 2048)
        .control(1, 0, 0, &[])
        .send_done(0, 2)
        .send_done(1, 2)
        .control(1, 5, 0, &[]);

    // A burst of chunks queued on both lanes, handed over one per lane and pump, with a
    // duplicate among them; then the rest at once.
    let burst = Script::new(3, 2, 2, 256)
        .start(0, 2048)
        .control(0, 1, 0, &[])
        .chunk(0, 0, 0, 0)
        .chunk(0, 1, 0, 0)
        .chunk(0, 4, 1, 0)
        .chunk(0, 0, 0, 0)
        .pump(1)
        .chunk(0, 2, 0, 0)
        .chunk(0, 5, 1, 0)
        .pump(1)
        .chunk(0, 3, 0, 0)
        .chunk(0, 6, 1, 0)
        .chunk(0, 7, 1, 0)
        .pump(255)
        .control(0, 5, 0, &[]);

    // Read completions that name no read: one never handed out, one reported twice.
    let stray_reads = Script::new(3, 1, 1, 1024)
        .start(0, 4096)
        .control(0, 1, 0, &[])
        .chunk(0, 0, 0, 0)
        .read_done(255, true)
        .next_timeout()
        .control(0, 3, 0, &[(1, 3)])
        .read_done(0, false)
        .read_done(254, true)
        .read_done(255, false);

    // A successor asks us (rank 1) for chunks we lack: we recurse to our predecessor.
    let recurse = Script::new(4, 1, 1, 256)
        .start(0, 1024)
        .control(0, 1, 0, &[])
        .chunk(0, 0, 0, 0)
        .control(2, 2, 0, &[(0, 4)])
        .next_timeout()
        .next_timeout();

    // Two operations in flight with two lanes, the second one starting early.
    let two = Script::new(3, 2, 2, 100)
        .start(1, 400)
        .control(1, 0, 1, &[])
        .start(0, 250)
        .control(1, 1, 0, &[])
        .chunk(0, 0, 0, 1)
        .chunk(0, 3, 1, 1)
        .next_timeout();

    // Rank 1 of 3 in an Allgatherv: the others' chunks arrive, some late, timers run.
    let allgather = Script::new(3, 1, 2, 512)
        .allgather(&[1024, 700, 1536])
        .control(0, 0, 0, &[])
        .control(2, 0, 0, &[])
        .control(0, 1, 0, &[])
        .chunk(0, 0, 0, 0)
        .chunk(0, 1, 1, 0)
        .chunk(0, 0, 0, 2)
        .next_timeout()
        .chunk(0, 2, 1, 2)
        .next_timeout();

    // Rank 0 of 2 is the root of a Broadcast, then 4095 ids run elsewhere: the next
    // Broadcast has the first one's tag and cannot start. The leaf's Ready for it comes first
    // (4096 ids ahead of the first), the leaf aborts the first (naming itself), and the second
    // starts and goes on at once.
    let skipped = Script::new(2, 0, 1, 1024)
        .start(0, 4096)
        .skip(4095)
        .start(0, 1024)
        .control_arg(1, 0, 254, broadcast_shape(Rank(0), 1024), &[])
        .control_arg(1, 6, 0, 1, &[])
        .start(0, 1024)
        .send_done(0, 1);

    // Rank 1 of 3: an operation run elsewhere fails over rank 2, and rank 0 asks where this
    // rank stands on the next one (Where, kind 8, for the next id): stopped over rank 2; then
    // a post waits to start (asked again: not posted), an operation is abandoned over rank 2
    // and the one after it asked about, and the next Broadcast runs.
    let late = Script::new(3, 1, 1, 1024)
        .skip(1)
        .failed_elsewhere(0, 2)
        .control_arg(0, 8, 254, 0, &[])
        .queued(true)
        .control_arg(0, 8, 254, 0, &[])
        .queued(false)
        .abandon(2)
        .control_arg(0, 8, 254, 0, &[])
        .start(0, 2048)
        .control(0, 1, 0, &[]);

    [
        ("leaf", leaf),
        ("late", late),
        ("skipped-ids", skipped),
        ("allgather", allgather),
        ("lossy-leaf", lossy),
        ("failed-copy", failed_copy),
        ("root", root),
        ("burst", burst),
        ("stray-reads", stray_reads),
        ("recurse", recurse),
        ("two-ops", two),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_owned(), s.0))
    .chain(
        // One layout check so the corpus also holds a config at the widest chunk split.
        ImmLayout::new(ImmLayout::MAX_CHUNK_BITS)
            .ok()
            .map(|_| ("empty-steps".to_owned(), Script::new(8, 7, 4, 4096).0)),
    )
    .collect()
}
