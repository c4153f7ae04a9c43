//! Internal plumbing shared by the operation state machines: the outbox and the context
//! handed to every handler.

use crate::config::{Config, Rank};
use crate::event::{OpError, ReadId, Stats, Transmit};
use crate::lane::LaneCommand;
use crate::time::Instant;
use crate::wire::{ChunkRun, ControlKind, ControlRepr, RunList, Standing};
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// A control message waiting to be written into the driver's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControlMsg {
    pub(crate) kind: ControlKind,
    pub(crate) op: u64,
    pub(crate) arg: u32,
    pub(crate) runs: Vec<ChunkRun>,
}

impl ControlMsg {
    pub(crate) fn simple(kind: ControlKind, op: u64) -> Self {
        ControlMsg {
            kind,
            op,
            arg: 0,
            runs: Vec::new(),
        }
    }

    pub(crate) fn repr(&self) -> ControlRepr<'_> {
        let (op, runs) = (self.op, RunList::Slice(&self.runs));
        match self.kind {
            ControlKind::Ready => ControlRepr::Ready {
                op,
                shape: self.arg,
            },
            ControlKind::Go => ControlRepr::Go { op },
            ControlKind::Fetch => ControlRepr::Fetch { op, runs },
            ControlKind::FetchAck => ControlRepr::FetchAck {
                op,
                runs,
                hops: self.arg,
            },
            ControlKind::FetchNack => ControlRepr::FetchNack { op },
            ControlKind::Fin => ControlRepr::Fin { op },
            ControlKind::Abort => ControlRepr::Abort {
                op,
                culprit: self.arg,
            },
            ControlKind::Activate => ControlRepr::Activate { op },
            ControlKind::Lacking => ControlRepr::Lacking { op },
            ControlKind::Mismatch => ControlRepr::Mismatch {
                op,
                culprit: self.arg,
            },
            ControlKind::Where => ControlRepr::Where { op },
            // `Self::here` stores only values that decode.
            ControlKind::Here => ControlRepr::Here {
                op,
                standing: Standing::from_u32(self.arg).unwrap_or(Standing::NotPosted),
            },
        }
    }

    /// `Here` for operation `op`: this rank stands so on it. A rank that the wire cannot
    /// carry (beyond any real communicator's size) is left out: plain `NotPosted`.
    pub(crate) fn here(op: u64, standing: Standing) -> Self {
        let arg = standing
            .to_u32()
            .or_else(|| Standing::NotPosted.to_u32())
            .unwrap_or_default();
        ControlMsg {
            kind: ControlKind::Here,
            op,
            arg,
            runs: Vec::new(),
        }
    }
}

/// Output queued by a handler, drained by `poll_transmit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outgoing {
    Control {
        to: Rank,
        msg: ControlMsg,
    },
    /// A transmit ready as it is (a read).
    Ready(Transmit),
}

/// How an operation ended, reported by a handler to the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Completed,
    /// Failed; `abort` says whether to tell every other rank.
    Failed {
        error: OpError,
        abort: bool,
    },
}

/// Everything a handler may touch besides its own operation.
pub(crate) struct Ctx<'a> {
    pub(crate) now: Instant,
    pub(crate) config: &'a Config,
    pub(crate) out: &'a mut VecDeque<Outgoing>,
    pub(crate) stats: &'a mut Stats,
    pub(crate) lanes: &'a mut VecDeque<LaneCommand>,
    pub(crate) next_read: &'a mut u64,
}

impl Ctx<'_> {
    pub(crate) fn send(&mut self, to: Rank, msg: ControlMsg) {
        self.out.push_back(Outgoing::Control { to, msg });
    }

    pub(crate) fn lane(&mut self, cmd: LaneCommand) {
        self.lanes.push_back(cmd);
    }

    /// A fresh read identifier, unique on this session.
    pub(crate) fn read_id(&mut self) -> ReadId {
        *self.next_read += 1;
        ReadId(*self.next_read)
    }
}

pub(crate) fn bump(c: &mut u64) {
    *c = c.saturating_add(1);
}
