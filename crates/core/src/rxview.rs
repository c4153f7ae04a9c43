//! The session's view of what an operation received on each lane.
//!
//! While the fast path runs, a lane's bitmap belongs to its [`LaneRx`](crate::lane::LaneRx);
//! the session knows only whether the lane said it is full. At the cutoff the session closes
//! the lanes that are not, and gets their bitmaps back; the slow path then works on those.

use crate::bitmap::{ChunkBitmap, Runs};
use crate::layout::Layout;
use crate::wire::ChunkRun;
use alloc::vec::Vec;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Lane {
    /// Open on the lane, not full yet (as far as we know).
    Open,
    /// `Close` sent, the bitmap is on its way back.
    Closing,
    /// The lane said every chunk is present; `open` while the lane still tracks it.
    Full { open: bool },
    /// The bitmap is back with us.
    Back(ChunkBitmap),
}

/// Per lane: where the bitmap is and what we know of it.
#[derive(Clone, Debug)]
pub(crate) struct RxView {
    lanes: Vec<Lane>,
}

/// Runs of one lane: from its bitmap, or the whole range of a full lane.
enum LaneRuns<'a> {
    Bits(Runs<'a>),
    One(Option<ChunkRun>),
}

impl Iterator for LaneRuns<'_> {
    type Item = ChunkRun;
    fn next(&mut self) -> Option<ChunkRun> {
        match self {
            LaneRuns::Bits(r) => r.next(),
            LaneRuns::One(r) => r.take(),
        }
    }
}

impl RxView {
    pub(crate) fn new(lanes: u32) -> Self {
        RxView {
            lanes: (0..lanes).map(|_| Lane::Open).collect(),
        }
    }

    /// Lane `l` said it is full.
    pub(crate) fn on_full(&mut self, l: usize) {
        // A `Closing` lane that filled up before the close still sends its bitmap: wait for it.
        if let Some(s @ Lane::Open) = self.lanes.get_mut(l) {
            *s = Lane::Full { open: true };
        }
    }

    /// Lane `l` handed its bitmap back.
    pub(crate) fn on_closed(&mut self, l: usize, bits: ChunkBitmap) {
        match self.lanes.get_mut(l) {
            Some(s @ Lane::Closing) => *s = Lane::Back(bits),
            Some(Lane::Full { open }) => *open = false,
            _ => {}
        }
    }

    /// The lanes still open and not known to be full.
    pub(crate) fn open_unfilled(&self) -> impl Iterator<Item = usize> + '_ {
        self.lanes
            .iter()
            .enumerate()
            .filter_map(|(l, s)| (*s == Lane::Open).then_some(l))
    }

    /// Marks every open, not full lane as closing and returns them: their bitmaps are needed.
    pub(crate) fn close_unfilled(&mut self) -> impl Iterator<Item = usize> + '_ {
        self.lanes.iter_mut().enumerate().filter_map(|(l, s)| {
            (*s == Lane::Open).then(|| {
                *s = Lane::Closing;
                l
            })
        })
    }

    /// Marks every lane that still tracks the operation as closed and returns them.
    pub(crate) fn close_all(&mut self) -> impl Iterator<Item = usize> + '_ {
        self.lanes
            .iter_mut()
            .enumerate()
            .filter_map(|(l, s)| match s {
                Lane::Open => {
                    *s = Lane::Closing;
                    Some(l)
                }
                Lane::Full { open: true } => {
                    *s = Lane::Full { open: false };
                    Some(l)
                }
                _ => None,
            })
    }

    /// Whether every lane's content is known here (full, or its bitmap back).
    pub(crate) fn known(&self) -> bool {
        self.lanes
            .iter()
            .all(|s| matches!(s, Lane::Full { .. } | Lane::Back(_)))
    }

    /// Whether every chunk is present.
    pub(crate) fn complete(&self) -> bool {
        self.lanes.iter().all(|s| match s {
            Lane::Full { .. } => true,
            Lane::Back(b) => b.is_full(),
            _ => false,
        })
    }

    fn lane_runs(&self, l: u32, r: ChunkRun, present: bool) -> LaneRuns<'_> {
        match &self.lanes[l as usize] {
            Lane::Back(b) => LaneRuns::Bits(b.runs(r, present)),
            Lane::Full { .. } => LaneRuns::One((present && r.len > 0).then_some(r)),
            // Unknown: nothing is vouched for, nothing is asked for.
            _ => LaneRuns::One(None),
        }
    }

    /// Marks a run (global numbering) present; returns how many chunks were new.
    pub(crate) fn record_fetched(&mut self, layout: &Layout, run: ChunkRun) -> u32 {
        let mut new = 0;
        for (l, r) in layout.split(run) {
            if let Lane::Back(b) = &mut self.lanes[l as usize] {
                new += b.insert_run(r);
            }
        }
        new
    }

    /// Whether every chunk of `run` is known present.
    pub(crate) fn holds(&self, layout: &Layout, run: ChunkRun) -> bool {
        run.end() <= layout.total()
            && layout
                .split(run)
                .all(|(l, r)| match &self.lanes[l as usize] {
                    Lane::Full { .. } => true,
                    Lane::Back(b) => b.contains_run(r),
                    _ => false,
                })
    }

    /// Missing (or, with `present`, held) chunks inside `within`, as maximal global runs
    /// appended to `out`, at most `max` runs in all. Lanes whose content is unknown
    /// contribute nothing either way.
    pub(crate) fn runs_within(
        &self,
        layout: &Layout,
        within: ChunkRun,
        present: bool,
        max: usize,
        out: &mut Vec<ChunkRun>,
    ) {
        for (l, r) in layout.split(within) {
            let base = layout.lane_start(l);
            for m in self.lane_runs(l, r, present) {
                let g = ChunkRun {
                    start: m.start + base,
                    len: m.len,
                };
                let full = out.len() >= max;
                match out.last_mut() {
                    Some(last) if last.end() == g.start => last.len += g.len,
                    _ if full => return,
                    _ => out.push(g),
                }
            }
        }
    }
}
