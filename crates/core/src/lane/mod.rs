//! Lanes: the hot path, split from the control path.
//!
//! Every multicast subgroup (lane) has a receive half, [`LaneRx`], and a send half,
//! [`LaneTx`], each owned by one worker (a thread, or a DPA event kernel). The
//! [`Session`](crate::Session) keeps the control path and talks to them with small typed
//! messages, drained like [`Session::poll_transmit`](crate::Session::poll_transmit):
//!
//! * commands, session to lane ([`LaneCommand`]): open or close an operation on a lane's
//!   receive half ([`RxCommand`]); start or cancel an active root's sends on its send half
//!   ([`TxCommand`]);
//! * notes, lane to session ([`LaneNote`]): a lane's part of an operation is full; a closed
//!   operation's bitmap, handed back; a root's sends on a lane are done.
//!
//! ## Who owns a bitmap
//! An operation's chunk bitmap for a lane lives in that lane's [`LaneRx`] from `Open` until
//! `Close`; the session never reads it there. When the fast path is over (the cutoff fired)
//! the session closes the lanes that are not yet full and gets their bitmaps back in
//! [`RxNote::Closed`]; from then on the slow path (ring recovery, reads) works on them alone.
//! A lane that filled up says so once ([`RxNote::Full`]); that is all the session needs to
//! know of it. So the slow path needs no query round trips to the lanes, and the fast path
//! never waits on the control path.
//!
//! A bitmap can also change hands a run at a time while the lane stays open: a lane that
//! sees a gap behind its stream, or that the session asks ([`RxCommand::Settle`]), *settles*
//! a block's chunks below a point: it hands them over in [`RxNote::Settled`] (with the runs
//! missing) and from then on drops any of them that still come, as stale. The session owns
//! those chunks exactly as it owns a closed lane's, and recovers the missing ones while the
//! data still flows (see the `ring` module). `Full` then means every chunk the lane still
//! tracks is written. The bits stay in the lane's words, frozen, and come back with the
//! `Closed` bitmap.
//!
//! ## Ordering rules a driver keeps
//! * A lane handles the commands queued for it before any chunk it receives after they were
//!   queued. An `Open` is queued before the rank says `Ready`, and no root sends before every
//!   `Ready` arrived, so no chunk can overtake its operation's `Open`.
//! * [`LaneRx::handle_chunk`] only claims a chunk. The driver copies the payload where the
//!   [`Placement`](crate::Placement) says, then calls [`LaneRx::commit`]. Notes are queued
//!   at commit (a watch point's `Started` and `Settled` too: a claim only marks it), so the
//!   session never acknowledges bytes that are not written yet. A settle stops below the
//!   chunk whose commit runs it, so a driver that commits in the order it claimed (every
//!   driver here commits each chunk right after its copy) never has a claimed, unwritten
//!   chunk handed over. A driver commits every claimed chunk before it hands the lane its
//!   next command (so a `Settle` command sees only written bits).
//! * A claimed chunk whose copy failed is released ([`LaneRx::release`]) instead of
//!   committed, before the lane takes another chunk or command: it counts as never
//!   arrived, and the session recovers it.

mod rx;
mod tx;

pub use rx::{LaneRx, Run, RxStats};
pub use tx::{LaneTx, Multicast, TxStats};

use crate::bitmap::ChunkBitmap;
use crate::config::Rank;
use crate::event::OpId;
use crate::wire::ChunkRun;
use alloc::vec::Vec;

/// Where one block's chunks sit on one lane: the placement arithmetic of the fast path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LaneBlock {
    /// Byte offset of the block in the operation's buffer.
    pub(crate) displ: u64,
    /// First block-local chunk index carried by this lane.
    pub(crate) lo: u32,
    /// Chunks of the block on this lane.
    pub(crate) count: u32,
    /// Lane-relative bitmap index of chunk `lo`.
    pub(crate) base: u32,
    /// Chunks of the whole block (tells a wrong lane from an index out of range).
    pub(crate) chunks: u32,
    /// Bytes of the block's last chunk.
    pub(crate) last_len: u32,
    /// Chunks of this lane's part that are full-size: `count`, or one fewer when the block's
    /// last chunk is on this lane (it is `last_len` long).
    pub(crate) full: u32,
}

/// Opens an operation on a lane's receive half: everything the fast path needs to place its
/// chunks. Built by the session; opaque to drivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RxOpen {
    pub(crate) op: OpId,
    pub(crate) tag: u32,
    pub(crate) blocks: Vec<LaneBlock>,
    pub(crate) len: u32,
    /// This rank's own chunks on the lane: present from the start.
    pub(crate) own: ChunkRun,
}

impl RxOpen {
    /// The operation opened.
    pub fn op(&self) -> OpId {
        self.op
    }
}

/// A command for a lane's receive half.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RxCommand {
    /// Track an operation's chunks on this lane.
    Open(RxOpen),
    /// Stop tracking an operation; the lane answers [`RxNote::Closed`].
    Close {
        /// Operation.
        op: OpId,
    },
    /// How many chunks of an operation are written? The lane answers [`RxNote::Count`].
    Count {
        /// Operation.
        op: OpId,
    },
    /// Hand the session block `block`'s chunks on this lane below `upto` (block-local chunk
    /// index) once the block's stream reached it: a chunk at `upto - 1` or later is present
    /// (at once if one is). `None`: all of the block's chunks still tracked, at once. The
    /// lane answers [`RxNote::Settled`] (nothing if the chunks were settled already).
    Settle {
        /// Operation.
        op: OpId,
        /// The block (its root).
        block: Rank,
        /// Block-local chunk index: settle the chunks below it.
        upto: Option<u32>,
    },
    /// Block `block`'s deadline passed. If chunks of it arrived on this lane since the last
    /// look (the block's first chunk, for the first) and some are still missing, the lane
    /// answers [`RxNote::Progress`] and keeps the block; otherwise it settles all of the
    /// block's chunks, as [`Settle`](Self::Settle) with `upto: None` does.
    Overdue {
        /// Operation.
        op: OpId,
        /// The block (its root).
        block: Rank,
    },
}

/// Starts an active root's multicasts of its own block on one lane. Opaque to drivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxStart {
    pub(crate) op: OpId,
    pub(crate) tag: u32,
    pub(crate) block: LaneBlock,
}

impl TxStart {
    /// The operation started.
    pub fn op(&self) -> OpId {
        self.op
    }
}

/// A command for a lane's send half.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxCommand {
    /// Multicast this rank's block of an operation on this lane.
    Start(TxStart),
    /// Stop sending an operation (it failed). Sends already posted still complete.
    Cancel {
        /// Operation.
        op: OpId,
    },
    /// Say how many of the operation's multicasts on this lane completed so far
    /// ([`TxNote::Sent`]): the session's check that its sends still progress.
    Count {
        /// Operation.
        op: OpId,
    },
}

/// A command from the session for one lane, from [`Session::poll_lane_command`](crate::Session::poll_lane_command).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaneCommand {
    /// For lane `lane`'s [`LaneRx`].
    Rx {
        /// Lane.
        lane: u16,
        /// What to do.
        cmd: RxCommand,
    },
    /// For lane `lane`'s [`LaneTx`].
    Tx {
        /// Lane.
        lane: u16,
        /// What to do.
        cmd: TxCommand,
    },
}

/// A bitmap handed back by a lane's receive half. Opaque to drivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneBitmap(pub(crate) ChunkBitmap);

impl LaneBitmap {
    /// Chunks present.
    pub fn present(&self) -> u32 {
        self.0.count()
    }

    /// Chunks tracked.
    pub fn len(&self) -> u32 {
        self.0.len()
    }

    /// True when the lane carries no chunk of the operation.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a lane's receive half tells the session.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RxNote {
    /// Every chunk of the operation the lane still tracks (all of them but those it
    /// settled) is present and written.
    Full {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
    },
    /// Chunks of the operation written on this lane so far (our own included), for
    /// [`RxCommand::Count`].
    Count {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
        /// Chunks present and written.
        committed: u32,
    },
    /// The first chunk of block `block` arrived on this lane.
    Started {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
        /// The block (its root).
        block: Rank,
    },
    /// The lane handed the session a run of one block's chunks while the operation stays
    /// open: chunks of `run` arriving later are dropped (as stale), and those of `missing`
    /// are the session's to recover. Every other chunk of `run` is present and written.
    Settled {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
        /// The block (its root).
        block: Rank,
        /// Lane-relative chunk numbers handed over.
        run: ChunkRun,
        /// Lane-relative runs of `run` that are missing, in order.
        missing: Vec<ChunkRun>,
    },
    /// Block `block` is overdue ([`RxCommand::Overdue`]) but its chunks are still arriving on
    /// this lane: the lane keeps it.
    Progress {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
        /// The block (its root).
        block: Rank,
    },
    /// The operation was closed on this lane: here is what arrived.
    Closed {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
        /// The lane's bitmap of the operation, every set bit committed.
        bitmap: LaneBitmap,
    },
}

/// What a lane's send half tells the session.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxNote {
    /// Every multicast of the operation on this lane was reported sent.
    SendsDone {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
    },
    /// The answer to [`TxCommand::Count`]: `done` multicasts of the operation on this lane
    /// were reported sent so far (0 when the lane no longer sends it).
    Sent {
        /// Lane.
        lane: u16,
        /// Operation.
        op: OpId,
        /// Completions so far.
        done: u32,
    },
}

/// A note for the session, passed to [`Session::handle_lane_note`](crate::Session::handle_lane_note).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaneNote {
    /// From a receive half.
    Rx(RxNote),
    /// From a send half.
    Tx(TxNote),
}

impl From<RxNote> for LaneNote {
    fn from(n: RxNote) -> Self {
        LaneNote::Rx(n)
    }
}

impl From<TxNote> for LaneNote {
    fn from(n: TxNote) -> Self {
        LaneNote::Tx(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// The structs the fast path touches per chunk: a growing one shows up in review.
    #[test]
    fn size_of_hot_structs() {
        let sizes = alloc::format!(
            "Placement {}\nLaneBlock {}\nLaneRx {}\nrx::RxOp {}\nrx::RxBlock {}\nLaneTx {}\nMulticast {}\n",
            size_of::<crate::Placement>(),
            size_of::<LaneBlock>(),
            size_of::<LaneRx>(),
            rx::op_size(),
            rx::block_size(),
            size_of::<LaneTx>(),
            size_of::<Multicast>(),
        );
        insta::assert_snapshot!(sizes);
    }
}
