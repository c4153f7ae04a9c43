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

/// Chunks a lane settled (handed to us) while it keeps the operation open: from then on
/// they are ours to recover, as after a close.
#[derive(Clone, Debug)]
struct Settled {
    /// Lane-relative runs handed over, sorted and disjoint.
    owned: Vec<ChunkRun>,
    /// Which chunks of `owned` are present (bits outside `owned` stay clear).
    bits: ChunkBitmap,
    /// Chunks of `owned` still missing.
    missing: u32,
}

impl Settled {
    /// Splits lane-relative `r` into pieces, each inside `owned` or outside it, in order.
    fn pieces(&self, r: ChunkRun) -> Vec<(ChunkRun, bool)> {
        let mut out = Vec::new();
        let mut at = r.start;
        let i = self.owned.partition_point(|o| o.end() <= r.start);
        for o in &self.owned[i..] {
            if o.start >= r.end() {
                break;
            }
            if o.start > at {
                out.push((ChunkRun::span(at, o.start), false));
            }
            let (s, e) = (o.start.max(at), o.end().min(r.end()));
            out.push((ChunkRun::span(s, e), true));
            at = e;
        }
        if at < r.end() {
            out.push((ChunkRun::span(at, r.end()), false));
        }
        out
    }
}

/// Per lane: where the bitmap is and what we know of it.
#[derive(Clone, Debug)]
pub(crate) struct RxView {
    lanes: Vec<Lane>,
    /// Per lane, what it settled before it closed (merged into its bitmap at the close).
    settled: Vec<Option<Settled>>,
}

/// Runs of one lane: from its bitmap, the whole range of a full lane, or pieces of both
/// while the lane has settled runs.
enum LaneRuns<'a> {
    Bits(Runs<'a>),
    One(Option<ChunkRun>),
    Many(alloc::vec::IntoIter<ChunkRun>),
}

impl Iterator for LaneRuns<'_> {
    type Item = ChunkRun;
    fn next(&mut self) -> Option<ChunkRun> {
        match self {
            LaneRuns::Bits(r) => r.next(),
            LaneRuns::One(r) => r.take(),
            LaneRuns::Many(r) => r.next(),
        }
    }
}

impl RxView {
    pub(crate) fn new(lanes: u32) -> Self {
        RxView {
            lanes: (0..lanes).map(|_| Lane::Open).collect(),
            settled: (0..lanes).map(|_| None).collect(),
        }
    }

    /// Lane `l` (of `len` chunks) handed us `run`, of which `missing` are missing.
    pub(crate) fn on_settled(&mut self, l: usize, len: u32, run: ChunkRun, missing: &[ChunkRun]) {
        if !matches!(
            self.lanes.get(l),
            Some(Lane::Open | Lane::Closing | Lane::Full { .. })
        ) || run.end() > len
        {
            return;
        }
        let s = self.settled[l].get_or_insert_with(|| Settled {
            owned: Vec::new(),
            bits: ChunkBitmap::new(len),
            missing: 0,
        });
        let i = s.owned.partition_point(|o| o.end() <= run.start);
        if s.owned.get(i).is_some_and(|o| o.start < run.end()) {
            return; // Settled once only: a repeat is ignored.
        }
        let mut at = run.start;
        for m in missing {
            let m = ChunkRun::span(m.start.max(at), m.end().min(run.end()));
            if m.len == 0 {
                continue;
            }
            s.bits.insert_run(ChunkRun::span(at, m.start));
            s.missing += m.len;
            at = m.end();
        }
        s.bits.insert_run(ChunkRun::span(at, run.end()));
        // Merge with the neighbours: runs stay maximal.
        let o = &mut s.owned;
        o.insert(i, run);
        if o.get(i + 1).is_some_and(|n| n.start == run.end()) {
            o[i] = ChunkRun::span(o[i].start, o[i + 1].end());
            o.remove(i + 1);
        }
        if i > 0 && o[i - 1].end() == o[i].start {
            o[i - 1] = ChunkRun::span(o[i - 1].start, o[i].end());
            o.remove(i);
        }
    }

    /// Whether lane `l` still tracks the operation and is not known full: settles make sense.
    pub(crate) fn is_open(&self, l: usize) -> bool {
        matches!(self.lanes.get(l), Some(Lane::Open))
    }

    /// Lane `l` said it is full.
    pub(crate) fn on_full(&mut self, l: usize) {
        // A `Closing` lane that filled up before the close still sends its bitmap: wait for it.
        if let Some(s @ Lane::Open) = self.lanes.get_mut(l) {
            *s = Lane::Full { open: true };
        }
    }

    /// Lane `l` handed its bitmap back.
    pub(crate) fn on_closed(&mut self, l: usize, mut bits: ChunkBitmap) {
        match self.lanes.get_mut(l) {
            Some(s @ Lane::Closing) => {
                // What we recovered of the settled runs meanwhile joins the lane's bitmap.
                if let Some(st) = self.settled[l].take() {
                    for o in &st.owned {
                        for p in st.bits.runs(*o, true) {
                            bits.insert_run(p);
                        }
                    }
                }
                *s = Lane::Back(bits)
            }
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
        self.lanes.iter().zip(&self.settled).all(|(s, st)| match s {
            Lane::Full { .. } => st.as_ref().is_none_or(|st| st.missing == 0),
            Lane::Back(b) => b.is_full(),
            _ => false,
        })
    }

    fn lane_runs(&self, l: u32, r: ChunkRun, present: bool) -> LaneRuns<'_> {
        let lane = &self.lanes[l as usize];
        if let Lane::Back(b) = lane {
            return LaneRuns::Bits(b.runs(r, present));
        }
        let full = matches!(lane, Lane::Full { .. });
        let Some(st) = &self.settled[l as usize] else {
            // Unknown: nothing is vouched for, nothing is asked for.
            return LaneRuns::One((full && present && r.len > 0).then_some(r));
        };
        let mut out: Vec<ChunkRun> = Vec::new();
        for (p, owned) in st.pieces(r) {
            if owned {
                out.extend(st.bits.runs(p, present));
            } else if full && present {
                out.push(p);
            }
        }
        LaneRuns::Many(out.into_iter())
    }

    /// Lane-relative runs within `run` (global) that are neither known present nor known
    /// missing, on lanes that still track the operation: a settle would tell.
    pub(crate) fn undecided(&self, layout: &Layout, run: ChunkRun, out: &mut Vec<(u32, ChunkRun)>) {
        for (l, r) in layout.split(run) {
            if !self.is_open(l as usize) {
                continue;
            }
            match &self.settled[l as usize] {
                None => out.push((l, r)),
                Some(st) => out.extend(
                    st.pieces(r)
                        .into_iter()
                        .filter(|(_, owned)| !owned)
                        .map(|(p, _)| (l, p)),
                ),
            }
        }
    }

    /// Marks a run (global numbering) present; returns how many chunks were new.
    pub(crate) fn record_fetched(&mut self, layout: &Layout, run: ChunkRun) -> u32 {
        let mut new = 0;
        for (l, r) in layout.split(run) {
            if let Lane::Back(b) = &mut self.lanes[l as usize] {
                new += b.insert_run(r);
            } else if let Some(st) = &mut self.settled[l as usize] {
                for (p, owned) in st.pieces(r) {
                    if owned {
                        let n = st.bits.insert_run(p);
                        st.missing -= n;
                        new += n;
                    }
                }
            }
        }
        new
    }

    /// Whether every chunk of `run` is known present.
    pub(crate) fn holds(&self, layout: &Layout, run: ChunkRun) -> bool {
        run.end() <= layout.total()
            && layout.split(run).all(|(l, r)| {
                let lane = &self.lanes[l as usize];
                if let Lane::Back(b) = lane {
                    return b.contains_run(r);
                }
                let full = matches!(lane, Lane::Full { .. });
                match &self.settled[l as usize] {
                    None => full,
                    Some(st) => st.pieces(r).into_iter().all(|(p, owned)| {
                        if owned { st.bits.contains_run(p) } else { full }
                    }),
                }
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
